"""A request for another port of a sandbox (``get_host(port)``, E2B's code interpreter on 49999), carried to that
port inside it as HTTP/1.1 over the connection stasis' exposed ports use (which resumes a paused sandbox first).

One upstream connection per request (``Connection: close``), the body streamed both ways, each way at the pace of
its reader. An answer that breaks off (the connection reset, bytes lost in the sandbox) is left unfinished, so the
client sees an error, never a short body that looks whole. E2B's own headers and credentials are not passed on.
WebSockets: :mod:`.port_websocket`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import h11
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from ....errors import StasisError
from ...rooms.ports import STASIS_COOKIES, Ports

log = logging.getLogger(__name__)

HOP_BY_HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
}  # fmt: skip
PRIVATE = {b"e2b-sandbox-id", b"e2b-sandbox-port", b"x-access-token", b"x-api-key", b"e2b-traffic-access-token"}
READ_SIZE = 1 << 16


async def proxy_http(ports: Ports, sandbox_id: str, port: int, scope: Scope, receive: Receive, send: Send) -> None:
    try:
        reader, writer = await ports.open(sandbox_id, port)
    except (StasisError, OSError, TimeoutError) as exc:
        text = f"nothing answers on port {port} of sandbox {sandbox_id}: {exc}"
        await PlainTextResponse(text, status_code=502)(scope, receive, send)
        return
    try:
        await _exchange(scope, receive, send, reader, writer, port)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _exchange(
    scope: Scope, receive: Receive, send: Send, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int
) -> None:
    connection = h11.Connection(h11.CLIENT)
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP | PRIVATE]
    target = scope.get("raw_path") or scope["path"].encode()
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    headers += [(b"host", f"localhost:{port}".encode()), (b"connection", b"close"), (b"transfer-encoding", b"chunked")]
    writer.write(connection.send(h11.Request(method=scope["method"], target=target, headers=headers)) or b"")
    while True:  # the request's body, as it comes
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        if body := message.get("body"):
            writer.write(connection.send(h11.Data(data=body)) or b"")
            await writer.drain()
        if not message.get("more_body"):
            break
    writer.write(connection.send(h11.EndOfMessage()) or b"")
    await writer.drain()
    started = False
    try:
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await reader.read(READ_SIZE))
                continue
            if isinstance(event, h11.Response):
                kept = [(k, v) for k, v in event.headers if k.lower() not in HOP_BY_HOP - {b"content-length"}
                        and not stasis_cookie(k, v)]  # fmt: skip
                await send({"type": "http.response.start", "status": event.status_code, "headers": kept})
                started = True
            elif isinstance(event, h11.Data):
                await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    except (ConnectionError, h11.RemoteProtocolError) as exc:
        if not started:
            await PlainTextResponse(f"port {port} answered no complete HTTP/1 head: {exc}", 502)(scope, receive, send)
        else:  # the response stays unfinished: the server closes the connection and the client sees it cut off
            log.warning("the answer of port %d broke off: %s; the client's response is left unfinished", port, exc)
        return
    if started:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    else:
        answer = PlainTextResponse(f"port {port} closed the connection without an answer", 502)
        await answer(scope, receive, send)


def stasis_cookie(name: bytes, value: bytes) -> bool:
    """A Set-Cookie naming one of stasis' own cookies (the console's session, a port's token): a sandbox's page
    never sets those, as a browser would send them to stasis' other listeners on the same host."""
    cookie = value.decode("latin-1").lstrip().lower()
    return name.lower() == b"set-cookie" and cookie.startswith(STASIS_COOKIES)
