"""Teams: tenants of one daemon. A key belongs to a team and carries scopes and an optional expiry; only the
sha256 of its secret is kept (a key is 192 random bits: a slow hash would add nothing). A team's quotas are
checked where a sandbox starts running (a create, a resume, an automatic resume), before anything is made.

A key reads ``sk_stasis_<id>_<secret>``: the id finds its row, the secret is compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import Conflict, Forbidden, NotFound, QuotaExceeded, Unauthorized, echo
from ...models import SandboxSpec, SandboxStatus
from ...team_models import (
    SCOPES,
    CreatedKey,
    CreateKeyRequest,
    CreateTeamRequest,
    ExportedKey,
    KeyInfo,
    TeamInfo,
    TeamQuotas,
)
from ..core.service import SandboxService
from ..core.tables import TeamTable

log = logging.getLogger(__name__)

S = SandboxStatus
KEY = re.compile(r"sk_stasis_([0-9a-z]{12})_([0-9a-f]{48})")
RUNNING = {
    S.PENDING,
    S.RUNNING,
    S.SNAPSHOTTING,
    S.RESUMING,
    S.SUSPENDING,
}  # what counts against a team's running quotas
TOUCH_EVERY = 60.0  # seconds between writes of a key's last use


@dataclass(frozen=True)
class Principal:
    """Who sends a request: the daemon's owner (its socket, or its token), or a team's key."""

    team: str | None
    scopes: frozenset[str]
    key_id: str | None = None

    def allows(self, scope: str) -> bool:
        if "admin" in self.scopes or scope in self.scopes:
            return True
        return scope == "read" and bool(self.scopes & {"write", "exec"})

    def sees(self, team: str | None) -> bool:
        """Whether what belongs to ``team`` is this principal's to see (the owner sees everything)."""
        return self.team is None or team == self.team


OWNER = Principal(None, frozenset(SCOPES))


class TeamsRoom:
    def __init__(self, core: SandboxService, table: TeamTable) -> None:
        self.core = core
        self.table = table  # this room is its one writer
        self.holdings: Callable[[str], list[str]] = lambda team: []  # a team's checkpoints and volumes (wiring)
        self.volume_limits: Callable[[str], dict[str, int]] = lambda team: {}  # its volumes' MiB limits (wiring)
        self._touched: dict[str, float] = {}

    # -- teams

    def create_team(self, request: CreateTeamRequest) -> TeamInfo:
        team = TeamInfo(name=request.name, created_at=time.time(), quotas=request.quotas)
        self.table.insert_team(team)
        log.info("team %s created", team.name)
        return team

    def teams(self) -> list[TeamInfo]:
        return self.table.teams()

    def team(self, name: str) -> TeamInfo:
        for team in self.table.teams():
            if team.name == name:
                return team
        raise NotFound(f"no team named {echo(name)}; `stasis team ls` lists them")

    def remove_team(self, name: str) -> None:
        self.team(name)
        if live := [info.name or info.id for info in self.core.list() if info.spec.team == name]:
            raise Conflict(f"team {echo(name)} has sandboxes ({', '.join(live[:5])}); terminate them first")
        if held := self.holdings(name):  # a team made again with this name would have them
            raise Conflict(f"team {echo(name)} still has {', '.join(held[:5])}; remove them first")
        self.table.delete_team(name)  # its keys are revoked with it
        log.info("team %s removed", name)

    def set_quotas(self, name: str, changes: dict[str, int | float | None]) -> TeamInfo:
        """The quotas named in ``changes`` set (None: no limit); the others kept."""
        team = self.team(name)
        quotas = TeamQuotas.model_validate({**team.quotas.model_dump(), **changes})
        self.table.update_quotas(name, quotas)
        return team.model_copy(update={"quotas": quotas})

    # -- keys

    def create_key(self, request: CreateKeyRequest, by: Principal) -> CreatedKey:
        self._may_manage(request.team, by)
        self.team(request.team)
        if by.team is not None and not set(request.scopes) <= by.scopes | {"read"}:
            raise Forbidden("a key can make keys with at most its own scopes")
        key_id = "".join(secrets.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(12))
        secret = secrets.token_hex(24)
        if request.made_by is not None and (by.team is not None or request.key is None):
            raise Forbidden("only the owner, giving a key itself, says which key made it")
        if request.key is not None:  # the same key on every node of a fleet
            given = KEY.fullmatch(request.key)
            if by.team is not None or given is None:
                raise Forbidden("only the owner gives a key itself, as sk_stasis_<12 of a-z0-9>_<48 hex>")
            if self.table.key_row(given[1]) is not None:
                raise Conflict(f"a key with id {given[1]} exists here already")
            key_id, secret = given[1], given[2]
        now = time.time()
        expires = now + request.expires_in_secs if request.expires_in_secs else None
        parent = self.table.key_row(by.key_id) if by.key_id else None
        if parent is not None and parent[0].expires_at is not None:  # a key made by a key never outlives it
            expires = min(expires or parent[0].expires_at, parent[0].expires_at)
        made_by = request.made_by or by.key_id
        if by.key_id is not None and self.working(by.key_id) is None:  # revoked while its request came in
            raise Unauthorized("the key making this key was revoked or expired meanwhile")
        info = KeyInfo(
            id=key_id,
            team=request.team,
            scopes=request.scopes,
            created_at=now,
            expires_at=expires,
            description=request.description,
            made_by=made_by,
        )
        self.table.insert_key(info, _digest(secret))
        log.info("key %s made for team %s with scopes %s", key_id, request.team, ",".join(request.scopes))
        return CreatedKey(**info.model_dump(), key=f"sk_stasis_{key_id}_{secret}")

    def export_keys(self) -> list[ExportedKey]:
        """Every key with its secret's hash (the owner's: a fleet's door copies them to a node that joined)."""
        rows = [self.table.key_row(key.id) for key in self.table.keys(team=None)]
        return [ExportedKey(**row[0].model_dump(), secret_sha256=row[1]) for row in rows if row is not None]

    def import_keys(self, keys: list[ExportedKey]) -> int:
        """The keys this daemon lacks added as they are (their teams must exist here), and revocations applied.
        How many changed."""
        teams, changed = {t.name for t in self.table.teams()}, 0
        for key in keys:
            found = self.table.key_row(key.id)
            if found is None and key.team in teams:
                self.table.insert_key(KeyInfo(**key.model_dump(exclude={"secret_sha256"})), key.secret_sha256)
                changed += 1
            if key.revoked_at is not None and (found is None or found[0].revoked_at is None):
                self.table.revoke_key(key.id)
                changed += 1
        return changed

    def keys(self, by: Principal, team: str | None = None) -> list[KeyInfo]:
        if by.team is not None:
            self._may_manage(by.team, by)
            team = by.team
        return self.table.keys(team)

    def revoke(self, key_id: str, by: Principal) -> KeyInfo:
        found = self.table.key_row(key_id)
        if found is None or not by.sees(found[0].team):
            raise NotFound(f"no key {echo(key_id)}; `stasis key ls` lists them")
        self._may_manage(found[0].team, by)
        revoked = self.table.revoke_key(key_id)
        log.info(
            "key %s of team %s revoked, with the %d keys it made (and theirs)",
            key_id,
            found[0].team,
            max(len(revoked) - 1, 0),
        )
        return found[0].model_copy(update={"revoked_at": time.time()})

    @staticmethod
    def _may_manage(team: str, by: Principal) -> None:
        if by.team is not None and (by.team != team or not by.allows("admin")):
            raise Forbidden("only the daemon's owner, or a key of the team with the admin scope, manages its keys")

    def authenticate(self, presented: str) -> Principal | None:
        """The team key ``presented`` stands for, if it is one that works now."""
        match = KEY.fullmatch(presented)
        if match is None:
            return None
        found = self.table.key_row(match[1])
        if found is None or not hmac.compare_digest(found[1], _digest(match[2])):
            return None
        return self.working(match[1])

    def working(self, key_id: str) -> Principal | None:
        """The principal of the key with id ``key_id`` while it works (not revoked, not expired): a console
        session made with a key asks on each page, so a revoked key's session ends with it."""
        found = self.table.key_row(key_id)
        if found is None:
            return None
        key, now = found[0], time.time()
        if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
            return None
        if now - self._touched.get(key.id, 0.0) > TOUCH_EVERY:
            self._touched[key.id] = now
            self.table.key_used(key.id, now)
        return Principal(key.team, frozenset(key.scopes), key.id)

    # -- quotas

    def admit(self, spec: SandboxSpec, sandbox_id: str | None = None) -> None:
        """Refuse (429) a sandbox of a team that would pass the team's quotas by running; ``sandbox_id``: one
        resuming (it does not count against itself)."""
        if spec.team is None:
            return
        try:
            quotas = self.team(spec.team).quotas
        except NotFound:
            raise Forbidden(f"team {spec.team!r} was removed; its sandboxes cannot start") from None
        theirs = [i for i in self.core.list() if i.spec.team == spec.team and i.id != sandbox_id]
        running = [i.spec for i in theirs if i.status in RUNNING]
        disks = sum(i.spec.disk_mb for i in theirs if i.status not in (S.TERMINATING, S.TERMINATED))
        if quotas.max_disk_mb is not None:  # its volumes and their snapshots count too
            disks += sum(self.volume_limits(spec.team).values())
        checks = (
            ("running sandboxes", quotas.max_running, len(running), 1, "max-running"),
            ("CPUs", quotas.max_cpus, sum(s.cpus for s in running), spec.cpus, "max-cpus"),
            ("MiB of memory", quotas.max_memory_mb, sum(s.memory_mb for s in running), spec.memory_mb, "max-memory-mb"),
            ("MiB of disk", quotas.max_disk_mb, disks, spec.disk_mb if sandbox_id is None else 0, "max-disk-mb"),
        )
        for what, limit, used, more, option in checks:
            if limit is not None and used + more > limit:
                what_to_do = "terminate one of its sandboxes or remove a volume" if option == "max-disk-mb" else (
                    "suspend or terminate one of its sandboxes (suspended ones do not count)")  # fmt: skip
                raise QuotaExceeded(
                    f"team {spec.team} has {used:g} {what} in use of its {limit:g}, and this sandbox needs {more:g} "
                    f"more; {what_to_do}, or raise the quota: stasis team set {spec.team} --{option} N"
                )

    def admit_volume(self, team: str, max_size_mb: int, name: str) -> None:
        """Refuse (429) volume ``name`` of ``max_size_mb`` (new, or its new limit) if the team's sandbox disks and
        volume limits would pass its disk quota: every team's volumes share one store."""
        limit = self.team(team).quotas.max_disk_mb
        if limit is None:
            return
        disks = sum(
            i.spec.disk_mb
            for i in self.core.list()
            if i.spec.team == team and i.status not in (S.TERMINATING, S.TERMINATED)
        )
        volumes = sum(mb for volume, mb in self.volume_limits(team).items() if volume != name)
        if disks + volumes + max_size_mb > limit:
            raise QuotaExceeded(
                f"team {team} has {disks + volumes} MiB of disk in use of its {limit} (sandbox disks, volume limits "
                f"and snapshots), and this volume needs {max_size_mb} more; remove a volume, a snapshot or a sandbox, "
                f"make a smaller "
                f"one (max_size_mb), or raise the quota: stasis team set {team} --max-disk-mb N"
            )

    def longest_lifetime(self, team: str | None) -> int | None:
        """The team's cap on a sandbox's lifetime, if it has one."""
        if team is None:
            return None
        try:
            return self.team(team).quotas.max_lifetime_secs
        except NotFound:
            return None

    def admit_checkpoint(self, team: str | None, stored: int) -> None:
        """Refuse a checkpoint of a team whose checkpoints already take its quota (``stored``: their bytes)."""
        if team is None:
            return
        limit = self.team(team).quotas.max_checkpoint_mb
        if limit is not None and stored >= limit << 20:
            raise QuotaExceeded(
                f"team {team}'s checkpoints take {stored >> 20} MiB of its {limit} MiB; delete some "
                f"(`stasis checkpoints`), or raise the quota: stasis team set {team} --max-checkpoint-mb N"
            )


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()
