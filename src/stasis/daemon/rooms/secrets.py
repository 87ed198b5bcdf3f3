"""Secrets that never enter a sandbox: the room that owns the daemon's secret stores and its CAs.

The owner's secrets are one store; each team has a store of its own (``team-secrets/TEAM``), which only its keys
reach and only its sandboxes draw from: a team's sandbox names its team's secrets, and no other's.

The wiring hands the core its broker (which puts secrets into HTTPS requests to their hosts) and its hooks:
each time a sandbox with secrets starts on this node, it makes it trust the CA this node holds for it
(:mod:`stasis.credentials.trust`): done once per sandbox and CA, again after a move (a new node, a new CA).
"""

from __future__ import annotations

import logging

from ...credentials import trust
from ...credentials.authority import Authorities
from ...credentials.broker import SecretBroker
from ...credentials.models import SecretInfo, SecretRequest
from ...credentials.store import SecretStore
from ...errors import InvalidRequest, NotFound
from ...fsutil import private_dir
from ...guest.client import GuestChannel
from ...models import SandboxInfo, SandboxSpec
from ...netpolicy import name_matches
from ...secretnames import referenced_secrets
from ...validation import validate_name
from ..core.service import SandboxService

log = logging.getLogger(__name__)


class SecretsRoom:
    def __init__(self, core: SandboxService) -> None:
        self.core = core
        self.store = SecretStore(core.paths.home / "secrets")
        self._team_stores: dict[str, SecretStore] = {}
        self.authorities = Authorities(core.paths.home / "secret-cas")
        self.broker = SecretBroker(self.of, self.authorities, self._spec_of)
        self._installed: dict[str, str] = {}  # sandbox id -> the CA fingerprint last put in it by this daemon

    def _spec_of(self, sandbox_id: str) -> SandboxSpec | None:
        try:
            return self.core.record(sandbox_id).spec
        except NotFound:
            return None

    def of(self, team: str | None) -> SecretStore:
        """The owner's store (None), or a team's (made on first use; team names are validated names)."""
        if team is None:
            return self.store
        if team not in self._team_stores:
            try:
                validate_name(team, "team")  # a spec's team, even one read back from the store, never a path
            except ValueError as exc:
                raise InvalidRequest(str(exc)) from None
            self._team_stores[team] = SecretStore(private_dir(self.core.paths.home / "team-secrets") / team)
        return self._team_stores[team]

    # ------------------------------------------------------------ the stores, for the faces

    def put(self, name: str, request: SecretRequest, team: str | None = None) -> tuple[SecretInfo, bool]:
        return self.of(team).put(name, request)

    def list(self, team: str | None = None) -> list[SecretInfo]:
        return self.of(team).list()

    def get(self, name: str, team: str | None = None) -> SecretInfo:
        return self.of(team).info(name)

    def remove(self, name: str, team: str | None = None) -> SecretInfo:
        return self.of(team).remove(name)

    def check(self, names: list[str], rules: dict[str, dict[str, str]], team: str | None = None) -> None:
        """A create that names secrets its store (its team's, or the owner's) lacks, or whose header rule for a host
        names a secret bound to other hosts, is refused before anything starts (the proxy would not send it)."""
        store = self.of(team)
        missing = [name for name in [*names, *referenced_secrets(rules)] if store.get(name) is None]
        if missing:
            known = ", ".join(s.name for s in store.list()) or "none yet"
            raise NotFound(
                f"no secret named {', '.join(missing)} on this daemon (secrets: {known}); add it first with "
                "`stasis secret add NAME --host HOST`"
            )
        for host, headers in rules.items():
            for name in referenced_secrets({host: headers}):
                hosts = store.info(name).hosts  # none: E2B's kind, sent only where its rules say
                if hosts and not any(name_matches(rule, host) for rule in hosts):
                    raise InvalidRequest(
                        f"the header rule for {host} names secret {name}, which is bound to {', '.join(hosts)}: a rule "
                        "may send a secret only to a host it is bound to; use a rule for one of those hosts, or bind "
                        f"the secret to {host} too (`stasis secret add {name} --host ...`, every host it may go to)"
                    )

    # ------------------------------------------------------------ the sandbox's side

    async def install_trust(self, info: SandboxInfo, channel: GuestChannel) -> None:
        lineage = info.spec.ca_lineage
        if lineage is None:
            return
        authority = self.authorities.get(lineage)
        if self._installed.get(info.id) == authority.fingerprint:
            return
        await trust.install(channel, authority.cert_pem, info.spec.secrets)
        self._installed[info.id] = authority.fingerprint
        log.info("%s trusts its CA %s", info.id, authority.fingerprint[:16])

    async def forget(self, sandbox_id: str) -> None:
        self._installed.pop(sandbox_id, None)
        self.broker.forget(sandbox_id)
