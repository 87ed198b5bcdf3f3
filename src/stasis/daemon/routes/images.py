"""Images: the builds this daemon holds, removal and pruning, and a build step's commit."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from ...errors import ImageNotFound, InvalidRequest
from ...images import ImageInfo
from ...models import CommitImageRequest
from .. import image_use
from ..rooms import RoomsDep

router = APIRouter()


@router.get("/v1/images")
async def images(rooms: RoomsDep) -> list[ImageInfo]:
    return rooms.core.images.list()


@router.get("/v1/images/{name}")
async def image(name: str, rooms: RoomsDep) -> ImageInfo:
    try:
        return rooms.core.images.get(name)
    except InvalidRequest as exc:  # creating from an unknown image is a bad request; looking one up, a 404
        raise ImageNotFound(exc.message, image=name[:80]) from None


@router.delete("/v1/images/{name}")
async def remove_image(name: str, rooms: RoomsDep) -> list[str]:
    """Every build of the image; 409 naming the sandboxes and checkpoints that use one."""
    return await asyncio.to_thread(image_use.remove, rooms.core, name)


@router.post("/v1/images/commit")
async def commit_image(request: CommitImageRequest, rooms: RoomsDep) -> ImageInfo:
    """A build step's image: the parent's files with a build sandbox's FILESYSTEM checkpoint applied."""
    return await image_use.commit(rooms.core, request)


@router.post("/v1/images/prune")
async def prune_images(rooms: RoomsDep, everything: bool = False) -> list[str]:
    """Builds nothing uses that no name resolves to any more (``everything``: unused current ones too)."""
    return await asyncio.to_thread(image_use.prune, rooms.core, everything)
