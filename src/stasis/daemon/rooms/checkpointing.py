"""Checkpoints: immutable artifacts of one instant of a sandbox (files, and for MEMORY its processes), kept
under ``checkpoints/`` and recorded in the store. A room above the core: it takes a sandbox's lock and
channel from it, and leaves the sandbox running."""

from __future__ import annotations

import asyncio
import logging
import time

from ... import faults
from ...backends.base import HostState
from ...fsutil import no_space
from ...models import CheckpointInfo, CheckpointType, CreateCheckpointRequest, SandboxStatus
from ..core.checkpoints import CheckpointFiles
from ..core.service import SandboxService, new_id
from ..core.states import require

log = logging.getLogger(__name__)

S = SandboxStatus


class Checkpoints:
    def __init__(self, core: SandboxService) -> None:
        self.core = core
        self.files: CheckpointFiles = core.checkpoint_files

    async def take(self, ref: str, request: CreateCheckpointRequest, *, internal: bool = False) -> CheckpointInfo:
        """Capture the sandbox (paused briefly) as an immutable artifact; it keeps running."""
        core = self.core
        info = await core.ensure_running(core.lookup(ref))
        async with core.lock(info.id):
            info = core.store.get(info.id)
            require(info, S.RUNNING)
            backend, box = core.backend_of(info), core.boxes.box(info)
            channel = await core.channel(info)
            now = time.time()
            checkpoint = CheckpointInfo(
                id=new_id("ck-"), name=request.name, type=request.type, sandbox_id=info.id, sandbox_name=info.name,
                image=box.image_key, spec=info.spec, backend=info.spec.backend, runtime=info.runtime,
                created_at=now, expires_at=now + request.ttl_secs if request.ttl_secs else None, sha256=None,
                size_bytes=0, metadata=request.metadata,
            )  # fmt: skip
            core.store.insert_checkpoint(checkpoint, internal=internal)  # intent: 'writing'
            core.store.transition(info.id, S.SNAPSHOTTING, f"{request.type.value} checkpoint {checkpoint.id}")
            faults.point("checkpoint.after_intent")
            started = time.monotonic()
            try:
                partial = self.files.begin(checkpoint.id)
                await backend.checkpoint(box, channel, partial, request.type == CheckpointType.MEMORY)
                faults.point("checkpoint.before_seal")
                sha256, size = await asyncio.to_thread(self.files.seal, checkpoint.id, not internal)
                faults.point("checkpoint.after_seal")
                checkpoint = checkpoint.model_copy(update={"sha256": sha256, "size_bytes": size})
                core.store.seal_checkpoint(checkpoint)  # outcome: 'ready'
            except BaseException as exc:
                self.files.remove(checkpoint.id)
                core.store.delete_checkpoint(checkpoint.id)
                alive = await backend.host_state(box) == HostState.RUNNING
                target = S.RUNNING if alive else S.FAILED
                core.store.transition(info.id, target, "checkpoint rolled back", error=f"checkpoint failed: {exc}")
                if (full := no_space(exc, self.files.root)) is not exc:
                    raise full from exc  # a full disk midway is the same 507 as the check before it
                raise
            faults.point("checkpoint.before_outcome")
            core.store.transition(info.id, S.RUNNING, f"checkpoint {checkpoint.id} ready")
            elapsed = time.monotonic() - started
            core.metrics.checkpoint_seconds.observe(elapsed)
            log.info("checkpoint %s (%s) of %s in %.3fs, %d bytes", checkpoint.id, request.type.value, info.id,
                     elapsed, size)  # fmt: skip
            return checkpoint

    def delete(self, ref: str) -> CheckpointInfo:
        checkpoint = self.core.store.get_checkpoint(ref)
        self.core.store.delete_checkpoint(checkpoint.id)  # the record first: a crash leaves a folder the sweep removes
        self.files.remove(checkpoint.id)
        log.info("deleted checkpoint %s", checkpoint.id)
        return checkpoint

    def expire(self) -> None:
        now = time.time()
        for checkpoint in self.core.store.list_checkpoints():
            if checkpoint.expires_at is not None and checkpoint.expires_at <= now:
                log.warning("checkpoint %s (%s) reached its TTL: deleting it", checkpoint.id, checkpoint.name)
                self.delete(checkpoint.id)
