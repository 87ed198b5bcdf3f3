"""Volumes as the daemon serves them: the store (:mod:`stasis.volumes`) with what only the daemon knows, which
sandboxes mount each one. A volume a sandbox (not ended) mounts is never removed under it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Iterator
from typing import Any

from ...errors import Conflict, InvalidRequest, NotFound, VolumeNotFound, echo
from ...models import SandboxSpec, SandboxStatus
from ...volume_models import CreateVolumeRequest, VolumeInfo, VolumeMount, VolumeSnapshotInfo
from ...volumes import Volumes, choose_disk
from ..core.service import SandboxService


def _mib(size_bytes: int) -> int:
    return -(-size_bytes // (1 << 20))


TEAM_VOLUME_MB = 1024  # a team's volume made without a limit gets this one: the store is every team's


class VolumesRoom:
    def __init__(self, core: SandboxService) -> None:
        self.core = core
        self.admit: Callable[[str, int, str], None] = lambda team, mb, name: None  # the team's quota (wiring)
        self._reserving: dict[str, dict[str, int]] = {}  # team -> volume -> MiB being made or resized now
        self.store = Volumes(core.paths.volumes, choose_disk(core.paths.volumes, core.paths.volume_image))
        self.store.sweep()

    def users(self, name: str) -> list[str]:
        """Sandboxes whose spec mounts ``name``: all but the terminated (a failed one may be resumed)."""
        return [
            info.id
            for info in self.core.list(include_terminated=False)
            if info.status != SandboxStatus.TERMINATED and any(m.name == name for m in info.spec.volumes)
        ]

    def info(self, name: str) -> VolumeInfo:
        info = self.store.get(name)
        return info.model_copy(
            update={"size_bytes": self.store.size(name), "mounted_by": self.users(name), "store": self.store.disk.kind}
        )

    def list(self, team: str | None = None) -> list[VolumeInfo]:
        """Every volume; ``team``'s only, if given."""
        return [self.info(v.name) for v in self.store.list() if team is None or v.team == team]

    def check(self, spec: SandboxSpec) -> None:
        """Every volume a new sandbox mounts exists (said now, not by a boot that fails), and is its team's."""
        for mount in spec.volumes:
            volume = self.store.get(mount.name)
            if spec.team is not None and volume.team != spec.team:
                raise VolumeNotFound(f"no volume named {echo(mount.name)}; `stasis volume ls` lists them")

    async def create(self, request: CreateVolumeRequest, team: str | None = None) -> VolumeInfo:
        source = self.store.snapshot(request.from_snapshot) if request.from_snapshot else None
        if team is not None and source is not None and source.team != team:
            raise VolumeNotFound(
                f"no volume snapshot {echo(request.from_snapshot or '')}; `stasis volume snapshots` lists them"
            )
        limit = request.max_size_mb
        if team is None:
            await asyncio.to_thread(self.store.create, request.name, request.from_snapshot, limit, team=team)
            return await asyncio.to_thread(self.info, request.name)
        # A team's volume always has a limit where the store keeps one, and counts in the team's disk quota as
        # the larger of its limit and what it holds: every team's volumes share one store.
        if self.store.disk.kind == "btrfs":
            limit = limit or (source.max_size_mb if source else None) or TEAM_VOLUME_MB
        held = _mib(source.size_bytes) if source else 0
        if limit is not None and held > limit:
            raise InvalidRequest(
                f"the snapshot holds {held} MiB, more than the limit of {limit} MiB: give a larger max_size_mb"
            )
        with self._reserved(team, request.name, max(limit or 0, held)):
            await asyncio.to_thread(self.store.create, request.name, request.from_snapshot, limit, team=team)
        return await asyncio.to_thread(self.info, request.name)

    async def set_limit(self, name: str, max_size_mb: int | None, team: str | None = None) -> VolumeInfo:
        if team is None:
            await asyncio.to_thread(self.store.set_limit, name, max_size_mb)
            return await asyncio.to_thread(self.info, name)
        if max_size_mb is None:
            raise InvalidRequest("a team's volume keeps a size limit: give max_size_mb (MiB)")
        held = _mib(await asyncio.to_thread(self.store.size, name))
        if held > max_size_mb:
            raise InvalidRequest(
                f"volume {echo(name)} holds {held} MiB: a team's volume's limit cannot go below what "
                "it holds; remove files first"
            )
        with self._reserved(team, name, max_size_mb):
            await asyncio.to_thread(self.store.set_limit, name, max_size_mb)
        return await asyncio.to_thread(self.info, name)

    @contextlib.contextmanager
    def _reserved(self, team: str, name: str, mib: int) -> Iterator[None]:
        """Admitted against the team's quota and counted from now (in this step of the event loop, so two requests
        at once cannot both pass) until the store has it."""
        self.admit(team, mib, name)
        self._reserving.setdefault(team, {})[name] = mib
        try:
            yield
        finally:
            self._reserving[team].pop(name, None)

    def limits(self, team: str) -> dict[str, int]:
        """What each of ``team``'s volumes counts, in MiB: its limit (a team's cannot go below what it holds), what
        it holds where it has none (one made before limits were kept, a store without them), or what is being made
        or resized for it now; and each of its snapshots, what it held when taken."""
        counted = {v.name: v.max_size_mb or _mib(self.store.size(v.name)) for v in self.store.list() if v.team == team}
        for name, mib in self._reserving.get(team, {}).items():
            counted[name] = max(counted.get(name, 0), mib)
        counted |= {f"snapshot {s.id}": _mib(s.size_bytes) for s in self.store.snapshots() if s.team == team}
        return counted

    async def remove(self, name: str) -> None:
        self.store.get(name)
        if users := self.users(name):
            raise Conflict(f"volume {echo(name)} is mounted by {', '.join(users)}; terminate them first (a suspended "
                           "sandbox still mounts its volumes)")  # fmt: skip
        await asyncio.to_thread(self.store.remove, name)

    async def snapshot(self, name: str, snapshot_name: str | None) -> VolumeSnapshotInfo:
        return await asyncio.to_thread(self.store.take_snapshot, name, snapshot_name)

    # -- volumes a checkpoint includes

    def keep(self, checkpoint_id: str, mounts: list[VolumeMount]) -> dict[str, str]:
        """A snapshot of each mounted volume, named after the checkpoint that includes them: volume -> snapshot."""
        taken: dict[str, str] = {}
        try:
            for index, name in enumerate(dict.fromkeys(m.name for m in mounts)):
                taken[name] = self.store.take_snapshot(name, f"{checkpoint_id}-v{index}").id
        except BaseException:
            self.drop(taken)
            raise
        return taken

    def drop(self, snapshots: dict[str, str]) -> None:
        for snapshot_id in snapshots.values():
            with contextlib.suppress(NotFound):
                self.store.remove_snapshot(snapshot_id)

    def fork_for(self, spec: SandboxSpec, snapshots: dict[str, str]) -> tuple[SandboxSpec, list[str]]:
        """``spec`` mounting, for each volume a checkpoint included, a new writable fork of its snapshot
        (``NAME-xxxxxx``) in its place; and the forks' names (removed by :meth:`discard` if the create fails)."""
        made: dict[str, str] = {}
        try:
            for name, snapshot_id in snapshots.items():
                made[name] = f"{name[:55]}-{secrets.token_hex(3)}"
                self.store.create(made[name], snapshot_id)
        except BaseException:
            self.discard([fork for fork in made.values() if self._exists(fork)])
            raise
        mounts = [m.model_copy(update={"name": made.get(m.name, m.name)}) for m in spec.volumes]
        return spec.model_copy(update={"volumes": mounts}), list(made.values())

    def discard(self, forks: list[str]) -> None:
        for fork in forks:
            with contextlib.suppress(NotFound):
                self.store.remove(fork)

    def _exists(self, name: str) -> bool:
        try:
            self.store.get(name)
        except NotFound:
            return False
        return True

    async def files(self, name: str, path: str, depth: int) -> dict[str, Any]:
        return {"path": path, "entries": await asyncio.to_thread(self.store.files, name, path, depth)}
