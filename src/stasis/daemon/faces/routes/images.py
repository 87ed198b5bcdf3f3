"""Images: the builds this daemon holds, removal and pruning, and a build step's commit."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from ....errors import ImageNotFound, InvalidRequest
from ....images import ImageInfo
from ....models import BuildImageRequest, CommitImageRequest
from ...rooms import image_use
from ...rooms.teams import Principal
from ..deps import RoomsDep
from ..progress import streamed
from ..tenancy import PrincipalDep

router = APIRouter()
Archive = Literal["oci-archive", "docker-archive"]


@router.post("/v1/images/import")
async def import_image(
    request: Request,
    rooms: RoomsDep,
    name: Annotated[str, Query(min_length=1, max_length=63)],
    ref: Annotated[str | None, Query(max_length=1024, description="docker://REGISTRY/REPO:TAG")] = None,
    archive: Annotated[Archive | None, Query(description="the body is an archive of this format")] = None,
    tag: Annotated[str | None, Query(max_length=128, description="the image to take from an OCI archive")] = None,
) -> StreamingResponse:
    """An OCI or Docker image, from a registry (``ref``) or uploaded as the body (``archive``: what the CLI and
    SDK send for a local file or OCI layout). Only the daemon writes its images; progress streams as JSON
    lines, the image last. A path on the daemon's host is never read for a client."""
    images = rooms.core.images
    if archive is None:
        if ref is None or not ref.startswith("docker://"):
            raise InvalidRequest("import from docker://REF, or upload an archive (`stasis image import` does)")
        return streamed(lambda report: images.import_image(ref, name, progress=report))
    images.directory.mkdir(parents=True, exist_ok=True)
    upload = images.directory / f".upload-{secrets.token_hex(6)}-{os.getpid()}"  # swept if this daemon dies
    try:
        with open(upload, "xb") as f:
            async for chunk in request.stream():
                await asyncio.to_thread(f.write, chunk)
    except BaseException:
        upload.unlink(missing_ok=True)
        raise
    source = f"{archive}:{upload}" + (f":{tag}" if tag and archive == "oci-archive" else "")
    return streamed(lambda report: images.import_image(source, name, progress=report), lambda: _remove(upload))


@router.post("/v1/images/build")
async def build_image(request: BuildImageRequest, rooms: RoomsDep) -> StreamingResponse:
    """A recipe's image (cached by the recipe's hash unless ``force``); progress streams as JSON lines."""
    images = rooms.core.images
    images.recipe(request.recipe)  # an unknown recipe is a 400 now, not a line in the stream
    return streamed(lambda report: images.build(request.recipe, progress=report, force=request.force))


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


@router.get("/v1/images")
async def images(rooms: RoomsDep, principal: PrincipalDep) -> list[ImageInfo]:
    return [_as_seen(info, principal) for info in rooms.core.images.list()]


@router.get("/v1/images/{name}")
async def image(name: str, rooms: RoomsDep, principal: PrincipalDep) -> ImageInfo:
    try:
        return _as_seen(rooms.core.images.get(name), principal)
    except InvalidRequest as exc:  # creating from an unknown image is a bad request; looking one up, a 404
        raise ImageNotFound(exc.message, image=name[:80]) from None


def _as_seen(info: ImageInfo, principal: Principal) -> ImageInfo:
    """A team's key sees an image's name, contents and size, never where the host keeps it or what it came from."""
    if principal.team is None:
        return info
    config = info.config.model_copy(update={"source": ""}) if info.config is not None else None
    return info.model_copy(update={"path": "", "source": info.source.split(":", 1)[0], "config": config})


@router.delete("/v1/images/{name}")
async def remove_image(name: str, rooms: RoomsDep) -> list[str]:
    """Every build of the image; 409 naming the sandboxes and checkpoints that use one."""
    return await asyncio.to_thread(image_use.remove, rooms.core, rooms.checkpoints, name)


@router.post("/v1/images/commit")
async def commit_image(request: CommitImageRequest, rooms: RoomsDep) -> ImageInfo:
    """A build step's image: the parent's files with a build sandbox's FILESYSTEM checkpoint applied."""
    return await image_use.commit(rooms.core, rooms.checkpoints, request)


@router.post("/v1/images/prune")
async def prune_images(rooms: RoomsDep, everything: bool = False) -> list[str]:
    """Builds nothing uses that no name resolves to any more (``everything``: unused current ones too)."""
    return await asyncio.to_thread(image_use.prune, rooms.core, rooms.checkpoints, everything)
