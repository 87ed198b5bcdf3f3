"""WebSockets into a sandbox: a terminal, an SSH connection, a raw TCP connection to one of its ports.
Over TCP each needs the API token or a team key with the exec scope (:mod:`..tenancy`)."""

from __future__ import annotations

import json

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ....errors import StasisError
from ...rooms import ssh
from ..deps import Rooms, RoomsDep
from ..portforward import serve_port_connection
from ..terminal import serve_terminal

router = APIRouter()


async def accepted(websocket: WebSocket, rooms: Rooms) -> bool:
    """Accept a WebSocket (:mod:`..tenancy` let it through: the owner, or a key with the exec scope whose team's
    sandbox it names)."""
    await websocket.accept()
    return True


@router.websocket("/v1/sandboxes/{ref}/pty")
async def pty(
    websocket: WebSocket, ref: str, rooms: RoomsDep, cols: int = 80, rows: int = 24, cmd: str | None = None
) -> None:
    """A terminal: binary frames are keystrokes and screen output; text frames are JSON control messages
    ({"type": "resize", "cols": C, "rows": R}). Closing detaches; the program goes on only if it is tmux
    (the default: a tmux session named after the sandbox)."""
    if not await accepted(websocket, rooms):
        return
    try:
        await serve_terminal(rooms.core, websocket, ref, cols, rows, json.loads(cmd) if cmd else None)
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except WebSocketDisconnect:
        pass


@router.websocket("/v1/sandboxes/{ref}/ssh")
async def ssh_session(websocket: WebSocket, ref: str, rooms: RoomsDep) -> None:
    """One SSH connection to the sandbox's OpenSSH server: binary frames both ways (`stasis ssh-proxy`)."""
    if not await accepted(websocket, rooms):
        return
    try:
        await ssh.serve_session(rooms.core, rooms.host_keys, websocket, ref)
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except WebSocketDisconnect:
        pass


@router.websocket("/v1/sandboxes/{ref}/ports/{port}/connect")
async def port_connect(websocket: WebSocket, ref: str, port: int, rooms: RoomsDep) -> None:
    """A raw TCP connection to a port in the sandbox: binary frames both ways (`stasis port-forward`)."""
    if not await accepted(websocket, rooms):
        return
    try:
        await serve_port_connection(rooms.core, rooms.ports, websocket, ref, port)
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except OSError as exc:
        await websocket.close(code=4502, reason=f"port {port}: {exc}"[:120])
