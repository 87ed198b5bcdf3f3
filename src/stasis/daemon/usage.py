"""What a sandbox's spec and disk come to: a restore's spec from its checkpoint, and `stasis df`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import InvalidRequest
from ..fsutil import tree_bytes
from ..models import CheckpointInfo, CheckpointType, CreateSandboxRequest, DiskUsage, SandboxSpec

if TYPE_CHECKING:
    from .service import SandboxService


def spec_from_checkpoint(checkpoint: CheckpointInfo, request: CreateSandboxRequest) -> SandboxSpec:
    """The checkpoint's resources; a MEMORY restore must keep its memory size and backend."""
    if "backend" in request.model_fields_set and request.backend != checkpoint.backend:
        raise InvalidRequest(
            f"checkpoint {checkpoint.id} was made on backend {checkpoint.backend!r}, not {request.backend!r}"
        )
    overrides = {
        k: getattr(request, k) for k in request.model_fields_set & {"timeout_secs", "on_idle", "cpus", "network"}
    }
    overrides["backend"] = checkpoint.backend
    if checkpoint.type == CheckpointType.FILESYSTEM:
        overrides |= {k: getattr(request, k) for k in request.model_fields_set & {"memory_mb", "disk_mb"}}
    else:
        for field, what in (("memory_mb", "memory"), ("disk_mb", "disk")):
            taken = getattr(checkpoint.spec, field)
            if field in request.model_fields_set and getattr(request, field) != taken:
                raise InvalidRequest(f"a MEMORY checkpoint restores with the {what} it was taken with ({taken} MiB)")
        if "network" in request.model_fields_set and (request.network is None) != (checkpoint.spec.network is None):
            had = "a network device" if checkpoint.spec.network else "no network device"
            raise InvalidRequest(
                f"checkpoint {checkpoint.id} holds a kernel with {had}; a MEMORY restore keeps that (its policy may "
                "change): restore a FILESYSTEM checkpoint to add or remove the network"
            )
    return checkpoint.spec.model_copy(update=overrides)


def disk_usage(service: SandboxService) -> DiskUsage:
    directory = service.paths.sandboxes
    sandboxes = {p.name: tree_bytes(p) for p in directory.iterdir()} if directory.exists() else {}
    checkpoints = {c.id: c.size_bytes for c in service.store.list_checkpoints(include_internal=True)}
    remote = service.remote
    cache_bytes, cache_chunks = remote.cache.usage() if remote else (0, 0)
    return DiskUsage(
        remote=remote.config.url if remote else None,
        remote_cache_bytes=cache_bytes,
        remote_cache_chunks=cache_chunks,
        remote_cache_limit_bytes=remote.config.cache_limit_bytes if remote else 0,
        sandboxes_bytes=sum(sandboxes.values()),
        checkpoints_bytes=sum(checkpoints.values()),
        images_bytes=sum(i.size_bytes for i in service.images.list()),
        sandboxes=sandboxes,
        checkpoints=checkpoints,
        shared_note=(
            "every sandbox and checkpoint shares its image read-only (counted once, under images); "
            "checkpoint files are copies (reflinks where the filesystem supports them)"
        ),
    )
