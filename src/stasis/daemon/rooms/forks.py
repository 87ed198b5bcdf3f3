"""Forks: live copies of a running sandbox that continue from one instant, then diverge."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

from ... import faults, tracing
from ...models import CheckpointInfo, CheckpointType, CreateCheckpointRequest, CreateSandboxRequest, SandboxInfo
from ..core.service import SandboxService
from ..core.sources import Restore
from .checkpointing import Checkpoints
from .front import Front


async def fork(service: SandboxService, checkpoints: Checkpoints, ref: str, times: int) -> list[SandboxInfo]:
    """A MEMORY checkpoint of this instant (internal: never listed, removed right after), restored ``times``
    times. All children or none: if one fails, the others are removed."""
    parent = service.lookup(ref)
    with tracing.span("sandbox.fork", parent.id, parent.spec.team, **{"stasis.fork.times": times}):
        return await _fork(service, checkpoints, parent, times)


async def _fork(
    service: SandboxService, checkpoints: Checkpoints, parent: SandboxInfo, times: int
) -> list[SandboxInfo]:
    ref = parent.id
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
    return await _all_or_none(service, children)


async def fork_checkpoint(
    service: SandboxService, checkpoints: Checkpoints, front: Front, ref: str, times: int
) -> list[SandboxInfo]:
    """``times`` new sandboxes from one checkpoint (a MEMORY one: each going on from its instant, then
    diverging): rollouts. All or none, as a live fork."""
    checkpoint = checkpoints.get(ref)
    with tracing.span("sandbox.fork", None, checkpoint.spec.team, **{"stasis.checkpoint.id": checkpoint.id,
                                                                     "stasis.fork.times": times}):  # fmt: skip
        return await _fork_checkpoint(service, checkpoints, front, checkpoint, times)


async def _fork_checkpoint(
    service: SandboxService, checkpoints: Checkpoints, front: Front, checkpoint: CheckpointInfo, times: int
) -> list[SandboxInfo]:
    source = await front.source(CreateSandboxRequest(snapshot_id=checkpoint.id, backend=checkpoint.backend))
    if isinstance(source, Restore) and source.verify:  # its bytes checked once, not once per child
        await asyncio.to_thread(checkpoints.files.verify, checkpoint.id, checkpoint.sha256)
        source = dataclasses.replace(source, verify=False)
    children = await asyncio.gather(*(front.create_from(None, source) for _ in range(times)), return_exceptions=True)
    return await _all_or_none(service, children)


async def _all_or_none(service: SandboxService, children: list[SandboxInfo | BaseException]) -> list[SandboxInfo]:
    failures = [c for c in children if isinstance(c, BaseException)]
    if failures:
        for child in children:
            if isinstance(child, SandboxInfo):
                await service.terminate(child.id)
        raise failures[0]
    return [c for c in children if isinstance(c, SandboxInfo)]
