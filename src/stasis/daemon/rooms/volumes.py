"""Volumes as the daemon serves them: the store (:mod:`stasis.volumes`) with what only the daemon knows, which
sandboxes mount each one. A volume a sandbox (not ended) mounts is never removed under it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from typing import Any

from ...errors import Conflict, InvalidRequest, NotFound, VolumeNotFound, echo
from ...models import SandboxSpec, SandboxStatus
from ...volume_models import CreateVolumeRequest, VolumeInfo, VolumeMount, VolumeSnapshotInfo
from ...volumes import Volumes, choose_disk
from ..core.service import SandboxService

TEAM_VOLUME_MB = 1024  # a team's volume made without a limit gets this one: the store is every team's


class VolumesRoom:
    def __init__(self, core: SandboxService) -> None:
        self.core = core
        self.admit: Callable[[str, int, str], None] = lambda team, mb, name: None  # the team's quota (wiring)
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
        if team is not None and request.from_snapshot and self.store.snapshot(request.from_snapshot).team != team:
            raise VolumeNotFound(
                f"no volume snapshot {echo(request.from_snapshot)}; `stasis volume snapshots` lists them"
            )
        limit = request.max_size_mb
        if team is not None:  # a team's volume always has a limit, and the limits count in the team's disk quota
            limit = limit or TEAM_VOLUME_MB
            self.admit(team, limit, request.name)
        await asyncio.to_thread(self.store.create, request.name, request.from_snapshot, limit, team=team)
        return await asyncio.to_thread(self.info, request.name)

    async def set_limit(self, name: str, max_size_mb: int | None, team: str | None = None) -> VolumeInfo:
        if team is not None:
            if max_size_mb is None:
                raise InvalidRequest("a team's volume keeps a size limit: give max_size_mb (MiB)")
            self.admit(team, max_size_mb, name)
        await asyncio.to_thread(self.store.set_limit, name, max_size_mb)
        return await asyncio.to_thread(self.info, name)

    def limits(self, team: str) -> dict[str, int]:
        """The MiB limit of each of ``team``'s volumes."""
        return {v.name: v.max_size_mb or 0 for v in self.store.list() if v.team == team}

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
