"""A raw TCP connection into a sandbox's port, carried over a WebSocket (`stasis port-forward`)."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import WebSocket, WebSocketDisconnect

from ...network.relay import CHUNK
from ..core.service import SandboxService
from ..rooms.ports import Ports


async def serve_port_connection(
    service: SandboxService, ports: Ports, websocket: WebSocket, ref: str, port: int
) -> None:
    info = service.get(ref)
    reader, writer = await ports.open(info.id, port)

    async def to_client() -> None:
        while data := await reader.read(CHUNK):
            service.activity.touch(info.id)
            await websocket.send_bytes(data)
        await websocket.close(code=1000, reason="the sandbox's end closed")

    downstream = asyncio.get_running_loop().create_task(to_client())
    try:
        while not downstream.done():
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            if data := message.get("bytes"):
                service.activity.touch(info.id)
                writer.write(data)
                await writer.drain()
    except (WebSocketDisconnect, ConnectionError):
        pass
    finally:
        downstream.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await downstream
        writer.close()
