"""A WebSocket for another port of a sandbox (noVNC's stream of E2B Desktop, a Jupyter kernel's channels),
carried as a WebSocket client of that port: the handshake made anew upstream (websockets' sans-I/O client, over
the connection stasis' exposed ports use, which resumes a paused sandbox first), then messages relayed both ways.
E2B's own headers and credentials are not passed on. A message from the sandbox is held whole before it is passed
on, so it has a bound: one over ``MESSAGE_LIMIT`` (in one frame or many fragments) closes both sides with 1009
("message too big"), as the client's own messages are bounded by the server's WebSocket limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import Receive, Scope, Send
from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ....errors import StasisError
from ....network.relay import until_first_done
from ...rooms.ports import Ports

log = logging.getLogger(__name__)

READ_SIZE = 1 << 16
HANDSHAKE_TIMEOUT = 60.0
MESSAGE_LIMIT = 16 << 20  # bytes of one message from the sandbox (uvicorn's bound on a client's, by default)
TOO_BIG = 1009


async def proxy_websocket(ports: Ports, sandbox_id: str, port: int, scope: Scope, receive: Receive, send: Send) -> None:
    if (await receive())["type"] != "websocket.connect":
        return
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    upstream = ClientProtocol(parse_uri(f"ws://localhost:{port}{target.decode(errors='replace')}"),
                              subprotocols=[Subprotocol(s) for s in scope.get("subprotocols", [])] or None,
                              max_size=MESSAGE_LIMIT)  # fmt: skip
    try:
        reader, writer = await ports.open(sandbox_id, port)
    except (StasisError, OSError, TimeoutError) as exc:
        await send({"type": "websocket.close", "code": 1011, "reason": f"nothing answers on port {port}: {exc}"[:120]})
        return
    try:
        early = await _handshake(upstream, reader, writer)
        if early is None:
            said = str(upstream.handshake_exc or "the port closed the connection")
            await send({"type": "websocket.close", "code": 1011, "reason": f"port {port} refused: {said}"[:120]})
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await _relay(upstream, reader, writer, receive, send, port, early)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _handshake(
    upstream: ClientProtocol, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> list[Frame] | None:
    """Open the WebSocket upstream: the frames that came in with its answer (a server may speak at once), or None
    when the port refused it."""
    upstream.send_request(upstream.connect())
    _flush(upstream, writer)
    async with asyncio.timeout(HANDSHAKE_TIMEOUT):
        while upstream.state is State.CONNECTING:
            data = await reader.read(READ_SIZE)
            if not data:
                upstream.receive_eof()
                break
            upstream.receive_data(data)
    events = upstream.events_received()  # the handshake's response, then any frames read with it
    _flush(upstream, writer)  # pongs for pings among them
    return [e for e in events if isinstance(e, Frame)] if upstream.state is State.OPEN else None


async def _relay(
    upstream: ClientProtocol, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, receive: Receive, send: Send,
    port: int, early: list[Frame],
) -> None:  # fmt: skip
    async def to_sandbox() -> None:
        while (message := await receive())["type"] == "websocket.receive":
            if message.get("bytes") is not None:
                upstream.send_binary(message["bytes"])
            else:
                upstream.send_text(str(message.get("text") or "").encode())
            _flush(upstream, writer)
            await writer.drain()
        upstream.send_close()  # the client left
        _flush(upstream, writer)

    async def to_client() -> None:
        parts: list[Frame] = []  # a message's fragments so far
        frames: list[Frame] = early
        while True:
            for frame in frames:
                if frame.opcode is Opcode.CLOSE:
                    code = upstream.close_rcvd.code if upstream.close_rcvd is not None else 1000
                    await send({"type": "websocket.close", "code": code})
                    return
                if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
                    parts.append(frame)
                    if frame.fin:
                        await send(_message(parts))
                        parts = []
            if upstream.parser_exc is not None:  # the protocol gave up on what the sandbox sent after those
                await send(_refusal(upstream.parser_exc, port))
                return
            try:
                data = await reader.read(READ_SIZE)
            except ConnectionError as exc:  # broken on the way (see guest_tcp): an error for the client too
                await send({"type": "websocket.close", "code": 1011, "reason": f"port {port}: {exc}"[:120]})
                return
            if not data:
                break
            upstream.receive_data(data)
            _flush(upstream, writer)  # the pongs the protocol answers pings with, or its close for a bad message
            frames = [event for event in upstream.events_received() if isinstance(event, Frame)]
        await send({"type": "websocket.close", "code": 1011, "reason": "the sandbox's port closed the connection"})

    for ended in await until_first_done(to_sandbox(), to_client()):
        if isinstance(ended, Exception) and not isinstance(ended, ConnectionError | RuntimeError):
            log.warning("a WebSocket to a sandbox port ended with %r", ended)


def _refusal(error: Exception, port: int) -> dict[str, object]:
    """The close the client gets when port ``port`` sent what the protocol refused (said first to the port)."""
    if isinstance(error, PayloadTooBig):
        reason = f"message too big: port {port} sent a message over {MESSAGE_LIMIT >> 20} MiB"
        return {"type": "websocket.close", "code": TOO_BIG, "reason": reason}
    said = f"port {port} broke the WebSocket protocol: {error}"
    return {"type": "websocket.close", "code": 1002, "reason": said[:120]}


def _message(parts: list[Frame]) -> dict[str, object]:
    data = b"".join(bytes(part.data) for part in parts)
    if parts[0].opcode is Opcode.TEXT:
        return {"type": "websocket.send", "text": data.decode(errors="replace")}
    return {"type": "websocket.send", "bytes": data}


def _flush(upstream: ClientProtocol, writer: asyncio.StreamWriter) -> None:
    for chunk in upstream.data_to_send():
        if chunk:  # an empty chunk asks for the end of the stream: closing the writer does that
            writer.write(chunk)
