"""Checkpoints: immutable artifacts of one instant of a sandbox (files, and for MEMORY its processes), kept
under ``checkpoints/`` and recorded in the checkpoint table, whose one writer this room is. Taking one is a
lifecycle operation of the core's (:meth:`SandboxService.operation`): the sandbox is paused briefly and
runs on."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ... import faults
from ...errors import Forbidden
from ...fsutil import no_space
from ...models import TEMPLATE_PREFIX, CheckpointInfo, CheckpointType, CreateCheckpointRequest, SandboxStatus
from ...volume_models import VolumeMount
from ..core.checkpoints import CheckpointFiles
from ..core.service import SandboxService, new_id
from ..core.states import require
from ..core.tables import CheckpointTable

log = logging.getLogger(__name__)

S = SandboxStatus


class Checkpoints:
    def __init__(self, core: SandboxService, table: CheckpointTable) -> None:
        self.core = core
        self.table = table
        self.files: CheckpointFiles = core.checkpoint_files
        # a checkpoint that includes its volumes keeps a snapshot of each (set where volumes are kept)
        self.keep_volumes: Callable[[str, list[VolumeMount]], dict[str, str]] = lambda checkpoint_id, mounts: {}
        self.drop_volumes: Callable[[dict[str, str]], None] = lambda snapshots: None
        self.admit: Callable[[str, int], None] = lambda team, stored: None  # a team's checkpoint quota (wiring)
        self._team_locks: dict[str, asyncio.Lock] = {}

    # ------------------------------------------------------------ reading, for every room and face

    def get(self, ref: str) -> CheckpointInfo:
        """A whole checkpoint by id or name."""
        return self.table.get_checkpoint(ref)

    def list(self, include_internal: bool = False) -> list[CheckpointInfo]:
        """Whole checkpoints, oldest first (``include_internal``: a fork's passing ones too)."""
        return self.table.list_checkpoints(include_internal)

    # ------------------------------------------------------------ writing

    async def take(self, ref: str, request: CreateCheckpointRequest, *, internal: bool = False) -> CheckpointInfo:
        """Capture the sandbox (paused briefly) as an immutable artifact; it keeps running. A team's are taken one
        at a time, each after its quota is checked (a fork's passing one is not kept, so not counted)."""
        team = self.core.lookup(ref).spec.team
        if team is None or internal:
            return await self._take(ref, request, internal)
        if (request.name or "").startswith(TEMPLATE_PREFIX):
            raise Forbidden(f"checkpoint names starting {TEMPLATE_PREFIX!r} are the daemon owner's templates")
        async with self._team_locks.setdefault(team, asyncio.Lock()):
            self.admit(team, sum(c.size_bytes for c in self.list() if c.spec.team == team))
            return await self._take(ref, request, internal)

    async def _take(self, ref: str, request: CreateCheckpointRequest, internal: bool) -> CheckpointInfo:
        core = self.core
        info = await core.ensure_running(core.lookup(ref))
        async with core.locked(info.id) as info:
            require(info, S.RUNNING)
            channel = await core.channel(info)
            now = time.time()
            checkpoint = CheckpointInfo(
                id=new_id("ck-"), name=request.name, type=request.type, sandbox_id=info.id, sandbox_name=info.name,
                image=info.image_key or core.images.get(info.spec.image).key, spec=info.spec,
                backend=info.spec.backend, runtime=info.runtime, created_at=now,
                expires_at=now + request.ttl_secs if request.ttl_secs else None, sha256=None, size_bytes=0,
                metadata=request.metadata,
            )  # fmt: skip
            self.table.insert_checkpoint(checkpoint, internal=internal)  # intent: 'writing'
            started = time.monotonic()
            detail = f"{request.type.value} checkpoint {checkpoint.id}"
            async with core.operation(info, S.SNAPSHOTTING, detail) as step:
                try:
                    partial = self.files.begin(checkpoint.id)
                    await step.backend.checkpoint(step.box, channel, partial, request.type == CheckpointType.MEMORY)
                    if request.include_volumes and info.spec.volumes:  # just after: the sandbox runs on meanwhile
                        kept = await asyncio.to_thread(self.keep_volumes, checkpoint.id, info.spec.volumes)
                        checkpoint = checkpoint.model_copy(update={"volume_snapshots": kept})
                    faults.point("checkpoint.before_seal")
                    sha256, size = await asyncio.to_thread(self.files.seal, checkpoint.id, not internal)
                    faults.point("checkpoint.after_seal")
                    checkpoint = checkpoint.model_copy(update={"sha256": sha256, "size_bytes": size})
                    self.table.seal_checkpoint(checkpoint)  # outcome: 'ready'
                except BaseException as exc:
                    self.drop_volumes(checkpoint.volume_snapshots)
                    self.files.remove(checkpoint.id)
                    self.table.delete_checkpoint(checkpoint.id)
                    if (full := no_space(exc, self.files.root)) is not exc:
                        raise full from exc  # a full disk midway is the same 507 as the check before it
                    raise
                step.detail = f"checkpoint {checkpoint.id} ready"
        elapsed = time.monotonic() - started
        core.metrics.checkpoint_seconds.observe(elapsed)
        log.info("checkpoint %s (%s) of %s in %.3fs, %d bytes", checkpoint.id, request.type.value, info.id,
                 elapsed, size)  # fmt: skip
        return checkpoint

    def adopt(self, checkpoint: CheckpointInfo) -> None:
        """A checkpoint whose files were just put whole in place (pulled from the remote store)."""
        self.table.insert_ready_checkpoint(checkpoint)

    def delete(self, ref: str) -> CheckpointInfo:
        checkpoint = self.table.get_checkpoint(ref)
        self.table.delete_checkpoint(checkpoint.id)  # the record first: a crash leaves a folder the sweep removes
        self.files.remove(checkpoint.id)
        self.drop_volumes(checkpoint.volume_snapshots)
        log.info("deleted checkpoint %s", checkpoint.id)
        return checkpoint

    def expire(self) -> None:
        now = time.time()
        for checkpoint in self.table.list_checkpoints():
            if checkpoint.expires_at is not None and checkpoint.expires_at <= now:
                log.warning("checkpoint %s (%s) reached its TTL: deleting it", checkpoint.id, checkpoint.name)
                self.delete(checkpoint.id)

    async def recover(self) -> None:
        """After a restart: checkpoints whose writing was cut off, and a fork's passing ones, go; so does every
        directory no checkpoint owns."""
        for checkpoint_id in self.table.unfinished_checkpoints():
            log.warning("removing checkpoint %s: its writing was cut off (or it was a fork's)", checkpoint_id)
            self.table.delete_checkpoint(checkpoint_id)
        for name in self.files.sweep(keep=self.table.all_checkpoint_ids()):
            log.warning("removed checkpoint directory %s that no checkpoint owns", name)
