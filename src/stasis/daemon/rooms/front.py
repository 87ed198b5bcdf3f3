"""The front desk every face (HTTP, MCP, the console, E2B) goes through to create or resume a sandbox.

It decides where the sandbox comes from, as a value for the core: a ready member of a warm pool, a
template's or a checkpoint's restore (fetched from the remote store if this node lacks it), a boot;
a resume of a sandbox this node does not hold takes it over from the remote store first. The core
(:mod:`.service`) then does the one thing it knows, with its locks, journal and rollback.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from ...errors import CheckpointNotFound, Forbidden, NotFound, SandboxNotFound, StateError
from ...models import TEMPLATE_PREFIX, CreateSandboxRequest, SandboxInfo, SandboxSpec
from ..core.service import SandboxService
from ..core.sources import CheckpointsRead, Restore, Source, source_of
from .pools import PoolManager
from .remote import RemoteService


class Front:
    def __init__(
        self,
        core: SandboxService,
        checkpoints: CheckpointsRead,
        pools: PoolManager,
        remote: RemoteService | None,
        check_secrets: Callable[[list[str], dict[str, dict[str, str]], str | None], None] = lambda n, r, t: None,
        check_volumes: Callable[[SandboxSpec], None] = lambda spec: None,
    ) -> None:
        self.check_volumes = check_volumes
        # a checkpoint that included its volumes: the new sandbox mounts forks of their snapshots (set in wiring)
        self.fork_volumes: Callable[[SandboxSpec, dict[str, str]], tuple[SandboxSpec, list[str]]] | None = None
        self.discard_volumes: Callable[[list[str]], None] = lambda forks: None
        self.core = core
        self.checkpoints = checkpoints
        self.pools = pools
        self.remote = remote
        self.check_secrets = check_secrets  # refuses a create naming a secret it lacks, or one a rule cannot send

    async def create(self, request: CreateSandboxRequest) -> SandboxInfo:
        """``request.team`` set: a team's sandbox (its key's), from a checkpoint of its own or a boot, never a
        pool's member; the secrets it names are its team's."""
        team = request.team
        self.check_secrets(list(request.secrets), request.egress_headers, team)  # a team's sandbox: its team's
        if team is None and (claimed := await self.pools.claim(request)) is not None:
            self.core.metrics.pool_claims.inc()
            return self.core.present(claimed)
        try:
            source = await self.source(request, pull=team is None)  # a key never pulls from the store
        except NotFound:
            if team is None or (request.snapshot_id is None and request.template is None):
                raise  # the owner's, or a boot's (an image not built yet): said as it is
            raise self._no_source(request) from None
        if isinstance(source, Restore) and team is not None and _shared_template(source):  # the owner's template
            source = dataclasses.replace(source, spec=source.spec.model_copy(update={"team": team}))
        elif isinstance(source, Restore) and source.checkpoint.spec.team != team:  # never another's, either way
            if team is not None:
                raise self._no_source(request)
            raise CheckpointNotFound(f"checkpoint {source.checkpoint.id} is team {source.checkpoint.spec.team}'s: "
                                     "create with team set to it")  # fmt: skip
        if "volumes" in request.model_fields_set and isinstance(source, Restore):  # a FILESYSTEM restore told
            mounted_as_told = source.checkpoint.model_copy(update={"volume_snapshots": {}})  # which volumes: those
            source = dataclasses.replace(source, checkpoint=mounted_as_told)
        return await self.create_from(request.name, source)

    async def create_from(self, name: str | None, source: Source, **extra: Any) -> SandboxInfo:
        """A sandbox from ``source``; for a checkpoint that included its volumes, mounting new forks of them."""
        forks: list[str] = []
        if isinstance(source, Restore) and source.checkpoint.volume_snapshots and self.fork_volumes is not None:
            spec, forks = await asyncio.to_thread(self.fork_volumes, source.spec, source.checkpoint.volume_snapshots)
            source = dataclasses.replace(source, spec=spec)
        try:
            self.check_volumes(source.spec)  # the request's, or a checkpoint's: each must still exist, said now
            return await self.core.create(name, source, **extra)
        except BaseException:
            await asyncio.to_thread(self.discard_volumes, forks)
            raise

    async def source(self, request: CreateSandboxRequest, pull: bool = True) -> Source:
        fetch = self.remote.pull_checkpoint if self.remote is not None and pull else None
        return await source_of(request, self.checkpoints, self.core.images, fetch)

    @staticmethod
    def _no_source(request: CreateSandboxRequest) -> NotFound:
        """What a key is told of a checkpoint or template that is not its team's: what a missing one gets."""
        if request.template is not None and request.snapshot_id is None:
            return NotFound(f"no template named {request.template[:80]!r}")
        return CheckpointNotFound(
            f"no checkpoint named or with id {str(request.snapshot_id)[:80]!r}; `stasis checkpoints` lists them"
        )

    async def resume(self, ref: str, team: str | None = None) -> SandboxInfo:
        """This node's sandbox, or one the remote store holds (taken over first); one that moved to another
        node is refused, naming that node. A team's key resumes only its own here (:mod:`..faces.tenancy`)."""
        core, remote = self.core, (self.remote if team is None else None)
        try:
            info = core.lookup(ref)
        except SandboxNotFound:
            if remote is None:
                raise
            await remote.pull_sandbox(ref)
            info = core.lookup(ref)
        else:
            if info.moved_to and remote is not None:
                await remote.pull_sandbox(info.id)  # it left this node: back only if the store has it
                info = core.lookup(info.id)
            elif remote is not None and remote.unsettled(info.id):
                raise StateError(
                    f"sandbox {info.name or info.id} was being pushed when the daemon stopped, and the remote store "
                    "could not be reached since to learn whether it took it; `stasis push` it again once the store "
                    "is reachable"
                )
        return await core.resume(info.id)


def _shared_template(source: Restore) -> bool:
    """A template the owner made (``template-NAME``, no team's: a team cannot take that name), which every team's
    key may start sandboxes from; each such sandbox is the team's own. One made with the owner's secrets is not
    shared: its egress proxy would put them into a team's requests."""
    checkpoint = source.checkpoint
    if checkpoint.spec.team is not None or not (checkpoint.name or "").startswith(TEMPLATE_PREFIX):
        return False
    spec = checkpoint.spec
    if spec.secrets or spec.egress_headers or spec.ca_lineage:
        raise Forbidden(f"template {checkpoint.name.removeprefix(TEMPLATE_PREFIX)!r} uses the daemon owner's "
                        "secrets: a team's key cannot start it")  # fmt: skip
    return True
