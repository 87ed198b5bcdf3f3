"""What sandboxes, checkpoints, images and the remote store's cache take on disk: `stasis df`."""

from __future__ import annotations

from ...fsutil import tree_bytes
from ...models import DiskUsage
from ..core.service import SandboxService
from .checkpointing import Checkpoints
from .remote import RemoteService


def disk_usage(service: SandboxService, checkpoints: Checkpoints, remote: RemoteService | None) -> DiskUsage:
    directory = service.paths.sandboxes
    sandboxes = {p.name: tree_bytes(p) for p in directory.iterdir()} if directory.exists() else {}
    sizes = {c.id: c.size_bytes for c in checkpoints.list(include_internal=True)}
    cache_bytes, cache_chunks = remote.cache.usage() if remote else (0, 0)
    return DiskUsage(
        remote=remote.config.url if remote else None,
        remote_cache_bytes=cache_bytes,
        remote_cache_chunks=cache_chunks,
        remote_cache_limit_bytes=remote.config.cache_limit_bytes if remote else 0,
        sandboxes_bytes=sum(sandboxes.values()),
        checkpoints_bytes=sum(sizes.values()),
        images_bytes=tree_bytes(service.images.directory),  # each file once: build layers share theirs
        sandboxes=sandboxes,
        checkpoints=sizes,
        shared_note=(
            "every sandbox and checkpoint shares its image read-only (counted once, under images); "
            "checkpoint files are copies (reflinks where the filesystem supports them)"
        ),
    )
