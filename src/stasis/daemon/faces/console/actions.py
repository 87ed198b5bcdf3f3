"""The console's actions (each needs the page's CSRF header), its live feed and its terminal."""

from __future__ import annotations

import asyncio
import json
import posixpath
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, UploadFile, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ....code_models import CodeRequest
from ....errors import StasisError
from ....models import CheckpointType, CreateCheckpointRequest, CreateSandboxRequest
from ...rooms.forks import fork
from ..deps import Rooms
from ..terminal import serve_terminal
from .render import FeedDep, RoomsDep, acting, admitted, refused, session_of

router = APIRouter()
ACTIONS = ("suspend", "resume", "checkpoint", "fork", "remove")


@router.post("/sandboxes/{ref}/upload", response_model=None)
async def upload(request: Request, ref: str, file: UploadFile, rooms: RoomsDep, dir: str = "/root") -> Response:
    if acting(request) is None:
        return refused()
    target = posixpath.join(dir, posixpath.basename(file.filename or "upload"))
    try:
        await rooms.ops.write_file(ref, target, await file.read())
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    return JSONResponse({"path": target})


@router.post("/sandboxes/{ref}/code", response_model=None)
async def run_code(request: Request, ref: str, rooms: RoomsDep) -> Response:
    """An execution's lines as they come (the page draws them: text as text, HTML in an inert frame)."""
    if acting(request) is None:
        return refused()
    code = str((await request.json()).get("code") or "")
    try:
        lines = await rooms.code.execute(ref, CodeRequest(code=code), _failed)
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    return StreamingResponse(lines, media_type="application/x-ndjson")


def _failed(exc: StasisError) -> dict[str, str]:
    return {"type": "error", "name": "stasis", "value": exc.message}


@router.post("/sandboxes/{ref}/{action}", response_model=None)
async def act(request: Request, ref: str, action: str, rooms: RoomsDep, feed: FeedDep) -> Response:
    if acting(request) is None:
        return refused()
    if action not in ACTIONS:
        return JSONResponse({"error": f"unknown action {action[:40]!r}"}, status_code=404)
    try:
        answer = await _do(rooms, request, ref, action)
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    feed.changed()
    return JSONResponse(answer)


async def _do(rooms: Rooms, request: Request, ref: str, action: str) -> dict[str, object]:
    if action == "suspend":
        await rooms.core.suspend(ref)
    elif action == "resume":
        await rooms.front.resume(ref)
    elif action == "checkpoint":
        kind = CheckpointType((await request.json()).get("type", "memory"))
        return {"checkpoint": (await rooms.checkpoints.take(ref, CreateCheckpointRequest(type=kind))).id}
    elif action == "fork":
        return {"sandboxes": [c.id for c in await fork(rooms.core, rooms.checkpoints, ref, 1)]}
    else:
        await rooms.core.terminate(ref)
    return {"ok": True}


@router.post("/checkpoints/{checkpoint_id}/restore", response_model=None)
async def restore(request: Request, checkpoint_id: str, rooms: RoomsDep, feed: FeedDep) -> Response:
    if acting(request) is None:
        return refused()
    try:
        info = await rooms.front.create(CreateSandboxRequest(snapshot_id=checkpoint_id))
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    feed.changed()
    return JSONResponse({"sandbox": info.id})


@router.get("/events", response_model=None)
async def events(request: Request, feed: FeedDep) -> Response:
    if session_of(request) is None:
        return refused()

    async def stream() -> AsyncIterator[bytes]:
        async for snapshot in feed.follow():
            if await request.is_disconnected():
                return
            yield b"data: " + json.dumps(snapshot).encode() + b"\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-store"})


@router.websocket("/sandboxes/{ref}/pty")
async def pty(websocket: WebSocket, ref: str, rooms: RoomsDep, cols: int = 80, rows: int = 24, csrf: str = "") -> None:
    if not await admitted(websocket, csrf, "the terminal"):
        return
    try:
        await serve_terminal(rooms.core, websocket, ref, cols, rows, ["/bin/sh", "-l"])
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except (WebSocketDisconnect, asyncio.CancelledError):
        pass
