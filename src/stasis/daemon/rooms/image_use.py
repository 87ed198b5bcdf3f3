"""Removing images: never one a sandbox or checkpoint of this daemon uses (each pins its exact build)."""

from __future__ import annotations

import asyncio

from ...errors import Conflict, ImageNotFound, InvalidRequest
from ...images import ImageInfo
from ...images.oci import ImageConfig
from ...images.recipe import RECIPES
from ...models import CheckpointType, CommitImageRequest
from ..core.service import SandboxService
from .checkpointing import Checkpoints


def users(service: SandboxService, checkpoints: Checkpoints) -> dict[str, list[str]]:
    """Image build key → who uses it ("sandbox work", "checkpoint ck-...")."""
    found: dict[str, list[str]] = {}
    for info in service.records():
        if info.image_key:
            found.setdefault(info.image_key, []).append(f"sandbox {info.name or info.id}")
    for checkpoint in checkpoints.list(include_internal=True):
        found.setdefault(checkpoint.image, []).append(f"checkpoint {checkpoint.name or checkpoint.id}")
    return found


def current(images: list[ImageInfo]) -> set[str]:
    """The build each name resolves to now: the recipe's current build, the latest import."""
    latest: dict[str, ImageInfo] = {}
    for image in images:
        if image.name in RECIPES:
            if image.key == RECIPES[image.name].key:
                latest[image.name] = image
        elif image.name not in latest or image.built_at > latest[image.name].built_at:
            latest[image.name] = image
    return {image.key for image in latest.values()}


def remove(service: SandboxService, checkpoints: Checkpoints, name: str) -> list[str]:
    """Every build of image ``name`` (or the one build ``name`` is the key of); refused, naming them,
    while anything uses one."""
    images = [i for i in service.images.list() if name in (i.name, i.key)]
    if not images:
        raise ImageNotFound(f"no image named {name!r}; `stasis image ls` lists them", image=name)
    used = users(service, checkpoints)
    blocking = [f"{who} ({image.key})" for image in images for who in used.get(image.key, [])]
    if blocking:
        raise Conflict(f"image {name!r} is in use by {', '.join(blocking)}; remove those first")
    for image in images:
        service.images.remove(image.key)
    return [image.key for image in images]


async def commit(service: SandboxService, checkpoints: Checkpoints, request: CommitImageRequest) -> ImageInfo:
    upper = None
    if request.checkpoint is not None:
        checkpoint = checkpoints.get(request.checkpoint)
        files = checkpoints.files.path(checkpoint.id) / "files"
        if checkpoint.type != CheckpointType.FILESYSTEM or checkpoint.backend != "gvisor" or not files.is_dir():
            raise InvalidRequest("an image is committed from a FILESYSTEM checkpoint of a gVisor build sandbox")
        if checkpoint.image != request.parent:  # its upper layer is relative to the image it ran on
            raise InvalidRequest(f"checkpoint {checkpoint.id} ran on image {checkpoint.image}, not {request.parent}")
        upper = files
    config = ImageConfig.model_validate(request.config)
    return await asyncio.to_thread(service.images.commit, request.parent, upper, request.name, request.key, config,
                                   request.step)  # fmt: skip


def prune(service: SandboxService, checkpoints: Checkpoints, everything: bool = False) -> list[str]:
    """Builds nothing uses that a name no longer resolves to (``everything``: current ones too)."""
    images = service.images.list()
    keep = set(users(service, checkpoints)) | (set() if everything else current(images))
    removed = []
    for image in images:
        if image.key not in keep:
            service.images.remove(image.key)
            removed.append(image.key)
    return removed
