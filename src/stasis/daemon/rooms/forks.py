"""Forks: live copies of a running sandbox that continue from one instant, then diverge."""

from __future__ import annotations

import asyncio
import secrets

from ... import faults
from ...models import CheckpointType, CreateCheckpointRequest, SandboxInfo
from ..core.service import SandboxService
from ..core.sources import Restore
from .checkpointing import Checkpoints


async def fork(service: SandboxService, checkpoints: Checkpoints, ref: str, times: int) -> list[SandboxInfo]:
    """A MEMORY checkpoint of this instant (internal: never listed, removed right after), restored ``times``
    times. All children or none: if one fails, the others are removed."""
    parent = service.lookup(ref)
    request = CreateCheckpointRequest(type=CheckpointType.MEMORY, metadata={"fork_of": parent.id})
    checkpoint = await checkpoints.take(ref, request, internal=True)
    faults.point("fork.after_checkpoint")
    # the parent's idle policy; no check of the bytes: this daemon wrote them a moment ago
    idle = ("timeout_secs", "on_idle", "lifetime_secs")
    spec = checkpoint.spec.model_copy(update={k: getattr(parent.spec, k) for k in idle})
    source = Restore(checkpoint, spec, verify=False)
    names = [f"{parent.name}-{secrets.token_hex(3)}" if parent.name else None for _ in range(times)]
    try:
        children = await asyncio.gather(
            *(service.create(name, source, forked_from=parent.id) for name in names), return_exceptions=True
        )
        faults.point("fork.after_children")
    finally:
        checkpoints.delete(checkpoint.id)
    failures = [c for c in children if isinstance(c, BaseException)]
    if failures:
        for child in children:
            if isinstance(child, SandboxInfo):
                await service.terminate(child.id)
        raise failures[0]
    return [c for c in children if isinstance(c, SandboxInfo)]
