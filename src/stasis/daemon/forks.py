"""Forks: live copies of a running sandbox that continue from one instant, then diverge."""

from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING

from .. import faults
from ..models import CheckpointType, CreateCheckpointRequest, CreateSandboxRequest, SandboxInfo

if TYPE_CHECKING:
    from .service import SandboxService


async def fork(service: SandboxService, ref: str, times: int) -> list[SandboxInfo]:
    """A MEMORY checkpoint of this instant (internal: never listed, removed right after), restored ``times``
    times. All children or none: if one fails, the others are removed."""
    parent = service.lookup(ref)
    request = CreateCheckpointRequest(type=CheckpointType.MEMORY, metadata={"fork_of": parent.id})
    checkpoint = await service.checkpoint(ref, request, internal=True)
    faults.point("fork.after_checkpoint")
    try:
        spec = {"timeout_secs": parent.spec.timeout_secs, "on_idle": parent.spec.on_idle}
        children = await asyncio.gather(
            *(
                service.create(
                    CreateSandboxRequest(
                        name=f"{parent.name}-{secrets.token_hex(3)}" if parent.name else None,
                        snapshot_id=checkpoint.id,
                        backend=parent.spec.backend,
                        **spec,
                    ),
                    verify=False,  # made a moment ago by this daemon
                    forked_from=parent.id,
                )
                for _ in range(times)
            ),
            return_exceptions=True,
        )
        faults.point("fork.after_children")
    finally:
        service.store.delete_checkpoint(checkpoint.id)
        service.checkpoint_files.remove(checkpoint.id)
    failures = [c for c in children if isinstance(c, BaseException)]
    if failures:
        for child in children:
            if isinstance(child, SandboxInfo):
                await service.terminate(child.id)
        raise failures[0]
    return [c for c in children if isinstance(c, SandboxInfo)]
