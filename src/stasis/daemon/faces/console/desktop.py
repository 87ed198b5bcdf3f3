"""The console's live view of a sandbox's desktop: noVNC in the page, over a WebSocket bridged to the desktop's
VNC server in the sandbox.

View-only by default, and not by the page's word: the bridge connects a watcher to the session's second VNC
server, which runs with -viewonly and drops every key and pointer event. Control is asked for explicitly (the
page reconnects with ``control=1``) and then reaches the server that takes input. Either way the WebSocket needs
the console's session and its CSRF token, as the terminal's does: the VNC servers are never published, so the
login is the only way to them. While a view is open the sandbox counts as in use (idle suspend waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, Response

from ....desktop import IMAGE
from ....errors import StasisError
from ....network.relay import until_first_done
from .render import RoomsDep, admitted, page, reach, session_of, to_login, until_ended

log = logging.getLogger(__name__)
router = APIRouter()
READ_SIZE = 1 << 16


@router.get("/sandboxes/{ref}/desktop", response_class=HTMLResponse, response_model=None)
async def desktop_page(request: Request, ref: str, rooms: RoomsDep) -> Response:
    if (session := session_of(request)) is None:
        return to_login()
    reach(rooms, session, "sandbox", ref)
    info = rooms.core.get(ref)
    return page(request, "desktop.html", session, info=info, is_desktop=info.spec.image == IMAGE)


@router.websocket("/sandboxes/{ref}/desktop/vnc")
async def vnc(websocket: WebSocket, ref: str, rooms: RoomsDep, csrf: str = "", control: bool = False) -> None:
    if not await admitted(websocket, csrf, "the live view"):
        return
    try:
        if (session := session_of(websocket)) is None:
            return await websocket.close(code=4401, reason="log in first")
        reach(rooms, session, "sandbox", ref, "exec")
        sandbox_id = rooms.core.lookup(ref).id
        reader, writer = await rooms.desktop.vnc(sandbox_id, control)
    except (StasisError, ConnectionError) as exc:
        said = exc.message if isinstance(exc, StasisError) else f"the desktop's VNC server did not answer: {exc}"
        await websocket.close(code=4400, reason=said[:120])
        return
    log.info("live view of %s opened (%s)", ref, "control" if control else "view only")
    with rooms.core.activity.busy(sandbox_id):
        await until_first_done(_bridge(websocket, reader, writer), until_ended(websocket))  # ends with the session


async def _bridge(websocket: WebSocket, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes both ways until either side ends."""

    async def to_sandbox() -> None:
        with contextlib.suppress(WebSocketDisconnect):
            while (message := await websocket.receive()).get("type") == "websocket.receive":
                writer.write(message.get("bytes") or (message.get("text") or "").encode())
                await writer.drain()

    async def to_browser() -> None:
        while data := await reader.read(READ_SIZE):
            await websocket.send_bytes(data)

    try:
        await until_first_done(to_sandbox(), to_browser())
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        with contextlib.suppress(RuntimeError, ConnectionError):
            await websocket.close()
