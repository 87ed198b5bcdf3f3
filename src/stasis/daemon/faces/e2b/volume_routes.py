"""E2B's Volumes, as its SDKs call them: the control plane's ``/volumes`` (the API key) and the content API
``/volumecontent/{id}/...`` (the volume's own token, ``Authorization: Bearer``), both stasis volumes.

A volume's E2B id is its stasis name. Its token is derived from the API key (nothing stored, a new key revokes
it). The content API reaches the volume's files on the host through :mod:`stasis.volume_files`, which never
follows a link a sandbox left there.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Iterator
from typing import IO, Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from .... import volume_files
from ....errors import InvalidRequest, NotFound
from ....volume_models import CreateVolumeRequest
from .plane import PlaneDep

router = APIRouter()
CONTENT = "/volumecontent/"
UNAUTHORIZED = "the volume content API needs the volume's token (Authorization: Bearer; Volume.token)"
UPLOADS = asyncio.Semaphore(4)  # uploads received at once (each spooled, at most MAX_WRITE)
E2B_USER = 1000  # what the content API's files belong to unless told: E2B's `user`, who runs its sandboxes' commands
MAX_WRITE = 4 << 30
SPOOL = 8 << 20  # bytes of an upload kept in memory; more goes to a temporary file

Path = Annotated[str, Query(max_length=4096)]
Id = Annotated[int | None, Query(ge=0, le=(1 << 31) - 1)]
Mode = Annotated[int | None, Query(ge=0, le=0o1777)]  # no set-id bits


class NewVolume(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(max_length=63)


class Change(BaseModel):
    model_config = ConfigDict(extra="ignore")
    uid: int | None = Field(None, ge=0, le=(1 << 31) - 1)
    gid: int | None = Field(None, ge=0, le=(1 << 31) - 1)
    mode: int | None = Field(None, ge=0, le=0o1777)


def _with_token(plane: Any, name: str) -> dict[str, Any]:
    incarnation = plane.room.volumes.store.get(name).incarnation
    return {"volumeID": name, "name": name, "token": plane.room.keys.volume_token(name, incarnation)}


@router.post("/volumes", status_code=201)
async def create(body: NewVolume, plane: PlaneDep) -> dict[str, Any]:
    await plane.room.volumes.create(CreateVolumeRequest(name=body.name))
    return _with_token(plane, body.name)


@router.get("/volumes")
async def listing(plane: PlaneDep) -> list[dict[str, Any]]:
    return [{"volumeID": v.name, "name": v.name} for v in await asyncio.to_thread(plane.room.volumes.store.list)]


@router.get("/volumes/{volume_id}")
async def get(volume_id: str, plane: PlaneDep) -> dict[str, Any]:
    return _with_token(plane, volume_id)


@router.delete("/volumes/{volume_id}", status_code=204)
async def destroy(volume_id: str, plane: PlaneDep) -> Response:
    await plane.room.volumes.remove(volume_id)
    return Response(status_code=204)


# -- the content API: the volume's token, never the API key's business


def token_holder(room: Any, path: str, authorization: str | None) -> bool:
    """Whether a content API request (``/volumecontent/ID/...``) carries that volume's token: checked by the face's
    middleware before any body is read. An unknown volume and a wrong token are refused alike."""
    volume_id = path[len(CONTENT) :].partition("/")[0]
    token = authorization[7:] if authorization and authorization[:7].lower() == "bearer " else None
    try:
        incarnation = room.volumes.store.get(volume_id).incarnation
    except (NotFound, InvalidRequest):
        return False
    return bool(room.keys.valid_volume_token(volume_id, incarnation, token))


def _root(plane: Any, request: Request, volume_id: str) -> Any:
    """The volume's files (its token was checked by the middleware; checked again here, after a body arrived)."""
    if not token_holder(plane.room, f"{CONTENT}{volume_id}/", request.headers.get("authorization")):
        raise HTTPException(401, UNAUTHORIZED)
    return plane.room.volumes.store.data(volume_id)


@router.get("/volumecontent/{volume_id}/dir")
async def list_dir(volume_id: str, path: Path, plane: PlaneDep, request: Request,
                   depth: Annotated[int, Query(ge=1, le=32)] = 1) -> list[dict[str, Any]]:  # fmt: skip
    return await asyncio.to_thread(volume_files.list_dir, _root(plane, request, volume_id), path, depth)


@router.post("/volumecontent/{volume_id}/dir", status_code=201)
async def make_dir(volume_id: str, path: Path, plane: PlaneDep, request: Request, uid: Id = None, gid: Id = None,
                   mode: Mode = None, force: bool = False) -> dict[str, Any]:  # fmt: skip
    owner = (E2B_USER if uid is None else uid, E2B_USER if gid is None else gid, 0o755 if mode is None else mode)
    return await asyncio.to_thread(volume_files.make_dir, _root(plane, request, volume_id), path, owner, force)


@router.get("/volumecontent/{volume_id}/path")
async def stat_path(volume_id: str, path: Path, plane: PlaneDep, request: Request) -> dict[str, Any]:
    return await asyncio.to_thread(volume_files.stat_path, _root(plane, request, volume_id), path)


@router.delete("/volumecontent/{volume_id}/path", status_code=204)
async def remove(volume_id: str, path: Path, plane: PlaneDep, request: Request) -> Response:
    await asyncio.to_thread(volume_files.remove, _root(plane, request, volume_id), path)
    return Response(status_code=204)


@router.patch("/volumecontent/{volume_id}/path")
async def change(volume_id: str, path: Path, body: Change, plane: PlaneDep, request: Request) -> dict[str, Any]:
    root = _root(plane, request, volume_id)
    return await asyncio.to_thread(volume_files.change, root, path, body.uid, body.gid, body.mode)


@router.get("/volumecontent/{volume_id}/file")
async def read_file(volume_id: str, path: Path, plane: PlaneDep, request: Request) -> StreamingResponse:
    chunks = await asyncio.to_thread(volume_files.read, _root(plane, request, volume_id), path)
    return StreamingResponse(_in_thread(chunks), media_type="application/octet-stream")


async def _in_thread(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    while (chunk := await asyncio.to_thread(next, chunks, b"")) != b"":
        yield chunk


@router.put("/volumecontent/{volume_id}/file", status_code=201)
async def write_file(volume_id: str, path: Path, plane: PlaneDep, request: Request, uid: Id = None, gid: Id = None,
                     mode: Mode = None, force: bool = False) -> dict[str, Any]:  # fmt: skip
    """The body (the raw bytes, as the SDKs send them) as the file, written whole or not at all."""
    owner = (E2B_USER if uid is None else uid, E2B_USER if gid is None else gid, 0o644 if mode is None else mode)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_WRITE:
        raise InvalidRequest(f"a volume file is at most {MAX_WRITE >> 30} GiB")
    async with UPLOADS:
        with tempfile.SpooledTemporaryFile(max_size=SPOOL) as spool:  # the body whole before the file is replaced
            await _receive(request, spool)
            root = _root(plane, request, volume_id)  # again: the volume may have been replaced while it came
            chunks = iter(lambda: spool.read(volume_files.CHUNK), b"")
            return await asyncio.to_thread(volume_files.write, root, path, chunks, owner, force)


async def _receive(request: Request, spool: IO[bytes]) -> None:
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_WRITE:
            raise InvalidRequest(f"a volume file is at most {MAX_WRITE >> 30} GiB")
        await asyncio.to_thread(spool.write, chunk)
    spool.seek(0)
