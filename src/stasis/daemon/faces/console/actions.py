"""The console's actions (each needs the page's CSRF header), its live feed and its terminal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import posixpath
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, UploadFile, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ....code_models import CodeRequest
from ....errors import StasisError
from ....models import CheckpointType, CreateCheckpointRequest, CreateSandboxRequest
from ....network.relay import until_first_done
from ...rooms.forks import fork
from ..deps import Rooms
from ..terminal import serve_terminal
from .render import FeedDep, RoomsDep, acting, admitted, reach, refused, session_of, until_ended, visible

router = APIRouter()
ACTIONS = ("suspend", "resume", "checkpoint", "fork", "remove")


@router.post("/sandboxes/{ref}/upload", response_model=None)
async def upload(request: Request, ref: str, file: UploadFile, rooms: RoomsDep, dir: str = "/root") -> Response:
    if (session := acting(request)) is None:
        return refused()
    target = posixpath.join(dir, posixpath.basename(file.filename or "upload"))
    try:
        reach(rooms, session, "sandbox", ref, "exec")
        await rooms.ops.write_file(ref, target, await file.read())
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    return JSONResponse({"path": target})


@router.post("/sandboxes/{ref}/code", response_model=None)
async def run_code(request: Request, ref: str, rooms: RoomsDep) -> Response:
    """An execution's lines as they come (the page draws them: text as text, HTML in an inert frame)."""
    if (session := acting(request)) is None:
        return refused()
    code = str((await request.json()).get("code") or "")
    try:
        reach(rooms, session, "sandbox", ref, "exec")
        lines = await rooms.code.execute(ref, CodeRequest(code=code), _failed)
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    return StreamingResponse(lines, media_type="application/x-ndjson")


def _failed(exc: StasisError) -> dict[str, str]:
    return {"type": "error", "name": "stasis", "value": exc.message}


@router.post("/sandboxes/{ref}/{action}", response_model=None)
async def act(request: Request, ref: str, action: str, rooms: RoomsDep, feed: FeedDep) -> Response:
    if (session := acting(request)) is None:
        return refused()
    if action not in ACTIONS:
        return JSONResponse({"error": f"unknown action {action[:40]!r}"}, status_code=404)
    try:
        reach(rooms, session, "sandbox", ref, "write")
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
    if (session := acting(request)) is None:
        return refused()
    try:
        reach(rooms, session, "checkpoint", checkpoint_id, "write")
        team = session.principal.team  # a key's restore is its team's, as on the API
        info = await rooms.front.create(CreateSandboxRequest(snapshot_id=checkpoint_id, team=team))
    except StasisError as exc:
        return JSONResponse({"error": exc.message}, status_code=exc.status_code)
    feed.changed()
    return JSONResponse({"sandbox": info.id})


@router.get("/events", response_model=None)
async def events(request: Request, feed: FeedDep) -> Response:
    if (session := session_of(request)) is None:
        return refused()

    async def stream() -> AsyncIterator[bytes]:
        last = None
        async for snapshot in feed.follow():
            if await request.is_disconnected() or session_of(request) is None:  # logged out, or its key revoked
                return
            shown = visible(session, snapshot, lambda s: s["team"])
            if shown != last:  # another team's change is no news here (nor a hint of it)
                yield b"data: " + json.dumps(shown).encode() + b"\n\n"
                last = shown

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"cache-control": "no-store"})


@router.websocket("/sandboxes/{ref}/pty")
async def pty(websocket: WebSocket, ref: str, rooms: RoomsDep, cols: int = 80, rows: int = 24, csrf: str = "") -> None:
    if not await admitted(websocket, csrf, "the terminal"):
        return
    try:
        session = session_of(websocket)
        if session is None:
            return await websocket.close(code=4401, reason="log in first")
        reach(rooms, session, "sandbox", ref, "exec")
        serving = serve_terminal(rooms.core, websocket, ref, cols, rows, ["/bin/sh", "-l"])
        ended = await until_first_done(serving, until_ended(websocket))
        if isinstance(ended[0], StasisError):
            raise ended[0]
        if ended[1] is None:  # the session ended first
            with contextlib.suppress(RuntimeError):  # already closed
                await websocket.close(code=4401, reason="the console session ended (logged out, or its key revoked)")
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except (WebSocketDisconnect, asyncio.CancelledError):
        pass
