"""Bridging a WebSocket to a pseudo-terminal in the sandbox."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging

from fastapi import WebSocket, WebSocketDisconnect

from ...errors import GuestDisconnected, InvalidRequest, StasisError
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ..core.service import SandboxService

log = logging.getLogger(__name__)


def default_command(name: str) -> list[str]:
    """A persistent tmux session named after the sandbox: leaving it detaches, coming back re-attaches."""
    return ["/bin/sh", "-c", f'command -v tmux >/dev/null && exec tmux new-session -A -s "{name}" || exec bash -l']


async def serve_terminal(
    service: SandboxService, websocket: WebSocket, ref: str, cols: int, rows: int, cmd: list[str] | None
) -> None:
    info = service.get(ref)
    session = (info.name or info.id).replace(".", "_")
    async with service.guest(ref) as channel:  # held in use (never idle-suspended) while attached
        opened = await channel.call(
            P.OpenPty(cmd=cmd or default_command(session), cols=cols, rows=rows, env={"TERM": "xterm-256color"})
        )
        pty_id = opened.id
        screen = asyncio.get_running_loop().create_task(_screen_to_client(channel, websocket, pty_id))
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("bytes"):
                    await channel.call(P.WritePty(id=pty_id, data=base64.b64encode(message["bytes"]).decode()))
                elif message.get("text"):
                    await _control(channel, pty_id, message["text"], websocket)
        except (WebSocketDisconnect, GuestDisconnected):
            pass
        finally:
            screen.cancel()
            with contextlib.suppress(asyncio.CancelledError, StasisError):
                await screen
            with contextlib.suppress(StasisError):
                await channel.call(P.ClosePty(id=pty_id))


async def _control(channel: GuestChannel, pty_id: str, text: str, websocket: WebSocket) -> None:
    try:
        control = json.loads(text)
        if control.get("type") != "resize":
            raise InvalidRequest(f"unknown control message {control.get('type')!r}; send {{'type': 'resize', ...}}")
        await channel.call(P.ResizePty(id=pty_id, cols=control.get("cols"), rows=control.get("rows")))
    except (ValueError, StasisError) as exc:
        await websocket.send_text(json.dumps({"type": "error", "message": str(exc)}))


async def _screen_to_client(channel: GuestChannel, websocket: WebSocket, pty_id: str) -> None:
    offset = 0
    try:
        while True:
            reply = await channel.call(P.ReadOutput(id=pty_id, offset=offset, wait=10, max_bytes=1 << 20), timeout=60)
            data = base64.b64decode(reply.data)
            if data:
                await websocket.send_bytes(data)
            offset = reply.next_offset
            if reply.eof:
                await websocket.close(code=1000, reason="the terminal's program ended")
                return
    except (GuestDisconnected, WebSocketDisconnect, RuntimeError):
        with contextlib.suppress(Exception):
            await websocket.close(code=1011, reason="the sandbox went away")
