"""`stasis ui`: the console on 127.0.0.1, for a daemon that serves only its unix socket.

A small reverse proxy that forwards ``/ui`` and nothing else (pages, the live feed, the terminal's
WebSocket) to the daemon's socket. Requests through it reach the daemon as the socket's, which the
daemon trusts, so the proxy must not pass anything else: the API stays on the socket (mode 0600).
The console itself still asks for a token, one the daemon made for this `stasis ui` (it lasts while
the daemon runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import unix_connect
from websockets.exceptions import ConnectionClosed

from ..network.relay import until_first_done
from ..origin import same_origin
from ..paths import Paths

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "content-length"}


def proxy_app(paths: Paths) -> Starlette:
    upstream = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(paths.socket)), base_url="http://stasis",
                                 timeout=httpx.Timeout(30.0, read=None))  # fmt: skip

    async def forward(request: Request) -> Response:
        path = request.url.path
        if path != "/ui" and not path.startswith("/ui/"):
            return PlainTextResponse("only the console (/ui) is served here", status_code=404)
        if not same_origin(request):  # the daemon sees the proxy's request, not the browser's: check here
            return PlainTextResponse("a request from another origin", status_code=403)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP | {"origin"}}
        sent = upstream.build_request(request.method, path, params=request.url.query, headers=headers,
                                      content=await request.body())  # fmt: skip
        answer = await upstream.send(sent, stream=True, follow_redirects=False)

        async def body() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
            finally:
                await answer.aclose()

        kept = [(k, v) for k, v in answer.headers.multi_items() if k.lower() not in HOP_BY_HOP]
        response = StreamingResponse(body(), status_code=answer.status_code)
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in kept]
        return response

    async def terminal(websocket: WebSocket) -> None:
        if not same_origin(websocket):  # the daemon sees the proxy's request, not the browser's: check here
            await websocket.close(code=4401)
            return
        path = websocket.url.path + (f"?{websocket.url.query}" if websocket.url.query else "")
        cookie = websocket.headers.get("cookie", "")
        try:
            remote = await unix_connect(str(paths.socket), "ws://stasis" + path, additional_headers={"cookie": cookie},
                                        max_size=None)  # fmt: skip
        except Exception:  # refused upstream (no session): refuse here too
            await websocket.close(code=4401)
            return
        await websocket.accept()

        async def to_daemon() -> None:
            with contextlib.suppress(WebSocketDisconnect):
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        return
                    await remote.send(message.get("bytes") if message.get("bytes") is not None else message["text"])

        async def to_browser() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for data in remote:
                    if isinstance(data, bytes):
                        await websocket.send_bytes(data)
                    else:
                        await websocket.send_text(data)

        await until_first_done(to_daemon(), to_browser())
        await remote.close()
        with contextlib.suppress(Exception):
            await websocket.close()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await upstream.aclose()

    routes = [
        WebSocketRoute("/ui/sandboxes/{ref}/pty", terminal),
        Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
