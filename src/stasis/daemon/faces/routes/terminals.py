"""WebSockets into a sandbox: a terminal, an SSH connection, a raw TCP connection to one of its ports.
Over TCP each needs the API token or a team key with the exec scope (:mod:`..tenancy`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from ....errors import StasisError
from ....network.relay import until_first_done
from ...rooms import ssh
from ..deps import Rooms, RoomsDep
from ..portforward import serve_port_connection
from ..tenancy import PRINCIPAL
from ..terminal import serve_terminal

log = logging.getLogger(__name__)
router = APIRouter()
KEY_CHECK_SECONDS = 0.5  # how soon a revoked or expired key's open terminal, SSH or port connection closes


async def accepted(websocket: WebSocket, rooms: Rooms) -> bool:
    """Accept a WebSocket (:mod:`..tenancy` let it through: the owner, or a key with the exec scope whose team's
    sandbox it names)."""
    await websocket.accept()
    return True


async def while_its_key_works(websocket: WebSocket, rooms: Rooms, serving: Coroutine[Any, Any, None]) -> None:
    """``serving`` for as long as the key that opened the WebSocket works: revoked (it, or a key that made it) or
    expired, the connection is closed within ``KEY_CHECK_SECONDS``. The owner's runs to its end."""
    principal = websocket.scope.get(PRINCIPAL)
    if principal is None or principal.key_id is None:
        return await serving

    async def key_ends() -> None:
        while rooms.teams.working(principal.key_id) is not None:
            await asyncio.sleep(KEY_CHECK_SECONDS)

    served, _ = await until_first_done(serving, key_ends())
    if served is not None and not isinstance(served, asyncio.CancelledError):
        raise served
    if isinstance(served, asyncio.CancelledError):  # the key ended first
        log.info("closing a WebSocket of key %s: the key no longer works", principal.key_id)
        with contextlib.suppress(RuntimeError):  # the client closed it meanwhile
            await websocket.close(code=4401, reason="the key was revoked or expired")


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
        command = json.loads(cmd) if cmd else None
        await while_its_key_works(websocket, rooms, serve_terminal(rooms.core, websocket, ref, cols, rows, command))
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
        await while_its_key_works(websocket, rooms, ssh.serve_session(rooms.core, rooms.host_keys, websocket, ref))
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
        connection = serve_port_connection(rooms.core, rooms.ports, websocket, ref, port)
        await while_its_key_works(websocket, rooms, connection)
    except StasisError as exc:
        await websocket.close(code=4400, reason=exc.message[:120])
    except OSError as exc:
        await websocket.close(code=4502, reason=f"port {port}: {exc}"[:120])
