"""Files and directories in a sandbox: binary-safe, streamed both ways."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from ....models import FileEntry
from ..deps import RoomsDep

router = APIRouter()
Path_ = Annotated[str, Query(min_length=1, max_length=4096, description="path inside the sandbox")]


@router.get("/v1/sandboxes/{ref}/files")
async def read_file(ref: str, path: Path_, rooms: RoomsDep) -> Response:
    return StreamingResponse(await rooms.ops.read_file(ref, path), media_type="application/octet-stream")


@router.put("/v1/sandboxes/{ref}/files")
async def write_file(
    ref: str, path: Path_, request: Request, rooms: RoomsDep, mode: Annotated[int, Query(ge=0, le=0o7777)] = 0o644
) -> FileEntry:
    """The request body is the file's raw bytes."""
    return await rooms.ops.write_file(ref, path, request.stream(), mode)


@router.put("/v1/sandboxes/{ref}/dirs")
async def upload_dir(ref: str, path: Path_, request: Request, rooms: RoomsDep, replace: bool = False) -> FileEntry:
    """The request body is a tar stream, unpacked as directory ``path`` (whole or not at all)."""
    return await rooms.ops.upload_dir(ref, path, request.stream(), replace)


@router.get("/v1/sandboxes/{ref}/dirs")
async def download_dir(ref: str, path: Path_, rooms: RoomsDep) -> Response:
    """Directory ``path`` as a tar stream."""
    return StreamingResponse(await rooms.ops.download_dir(ref, path), media_type="application/x-tar")


@router.delete("/v1/sandboxes/{ref}/files", status_code=204)
async def delete_file(ref: str, path: Path_, rooms: RoomsDep, recursive: bool = False) -> Response:
    await rooms.ops.delete_file(ref, path, recursive)
    return Response(status_code=204)


@router.get("/v1/sandboxes/{ref}/files/list")
async def list_directory(ref: str, path: Path_, rooms: RoomsDep) -> list[FileEntry]:
    return await rooms.ops.list_directory(ref, path)


@router.get("/v1/sandboxes/{ref}/files/stat")
async def stat(ref: str, path: Path_, rooms: RoomsDep) -> FileEntry:
    return await rooms.ops.stat(ref, path)


@router.post("/v1/sandboxes/{ref}/files/mkdir")
async def mkdir(ref: str, path: Path_, rooms: RoomsDep) -> FileEntry:
    return await rooms.ops.mkdir(ref, path)
