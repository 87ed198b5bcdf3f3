"""Volumes as the daemon serves them: the store (:mod:`stasis.volumes`) with what only the daemon knows, which
sandboxes mount each one. A volume a sandbox (not ended) mounts is never removed under it."""

from __future__ import annotations

import asyncio
from typing import Any

from ...errors import Conflict, echo
from ...models import SandboxSpec, SandboxStatus
from ...volume_models import CreateVolumeRequest, VolumeInfo, VolumeSnapshotInfo
from ...volumes import Volumes, choose_disk
from ..core.service import SandboxService


class VolumesRoom:
    def __init__(self, core: SandboxService) -> None:
        self.core = core
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

    def list(self) -> list[VolumeInfo]:
        return [self.info(v.name) for v in self.store.list()]

    def check(self, spec: SandboxSpec) -> None:
        """Every volume a new sandbox mounts exists (said now, not by a boot that fails)."""
        for mount in spec.volumes:
            self.store.get(mount.name)

    async def create(self, request: CreateVolumeRequest) -> VolumeInfo:
        await asyncio.to_thread(self.store.create, request.name, request.from_snapshot, request.max_size_mb)
        return await asyncio.to_thread(self.info, request.name)

    async def set_limit(self, name: str, max_size_mb: int | None) -> VolumeInfo:
        await asyncio.to_thread(self.store.set_limit, name, max_size_mb)
        return await asyncio.to_thread(self.info, name)

    async def remove(self, name: str) -> None:
        self.store.get(name)
        if users := self.users(name):
            raise Conflict(f"volume {echo(name)} is mounted by {', '.join(users)}; terminate them first (a suspended "
                           "sandbox still mounts its volumes)")  # fmt: skip
        await asyncio.to_thread(self.store.remove, name)

    async def snapshot(self, name: str, snapshot_name: str | None) -> VolumeSnapshotInfo:
        return await asyncio.to_thread(self.store.take_snapshot, name, snapshot_name)

    async def files(self, name: str, path: str, depth: int) -> dict[str, Any]:
        return {"path": path, "entries": await asyncio.to_thread(self.store.files, name, path, depth)}
