"""WebSockets through the fleet's door: a terminal (`stasis shell`), an SSH connection, a raw TCP connection to a
sandbox's port (`stasis port-forward`), each relayed to the node that holds the sandbox, frame by frame. The door's
HTTP check does not run for a WebSocket: each is checked here, before anything else."""

from __future__ import annotations

import contextlib
import hmac
import logging
from urllib.parse import urlencode

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from ..errors import StasisError
from ..network.relay import until_first_done
from .nodes import Nodes, node_path
from .tenants import KEY, Keys, bearer, not_found

log = logging.getLogger(__name__)

MAX_MESSAGE = 16 << 20  # bytes of one message, as the daemon's own WebSockets allow
OPEN_TIMEOUT = 60.0  # seconds for the node to answer the upgrade (it may resume the sandbox first)


def websocket_routes(app: FastAPI, nodes: Nodes, token: str, keys: Keys) -> None:
    @app.websocket("/v1/sandboxes/{ref}/{rest:path}")
    async def relayed(websocket: WebSocket, ref: str, rest: str) -> None:
        """A team's key goes on to the node, which answers it as the key (its team's sandbox, the exec scope)."""
        sent = websocket.headers.get("authorization", "")
        caller = None  # the fleet's token: the node client's own
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            if not await _works(keys, sent.removeprefix("Bearer ")):
                await websocket.close(code=4401, reason="missing or wrong API token or key")
                return
            caller = bearer(sent.removeprefix("Bearer "))
        try:
            path = node_path("sandboxes", ref, rest)
            node = await nodes.found("sandboxes", ref, caller)
        except StasisError as exc:
            said = not_found("sandboxes", ref).message if caller and exc.status_code in (404, 410) else exc.message
            await websocket.close(code=4400, reason=said[:120])
            return
        query = urlencode(list(websocket.query_params.multi_items()))
        url = node["url"].replace("http://", "ws://", 1) + path + (f"?{query}" if query else "")
        try:
            upstream = await connect(url, additional_headers=caller or {"authorization": f"Bearer {token}"},
                                     proxy=None, max_size=MAX_MESSAGE, max_queue=4,
                                     open_timeout=OPEN_TIMEOUT)  # fmt: skip
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            where = "its node" if caller else f"node {node['name']}"  # a key learns no node's name
            await websocket.close(code=4502, reason=f"{where}: {exc}"[:120])
            return
        await websocket.accept()
        await relay(websocket, upstream)


async def _works(keys: Keys, key: str) -> bool:
    if not KEY.fullmatch(key):
        return False
    try:
        await keys.who(key)
    except StasisError:
        return False
    return True


async def relay(websocket: WebSocket, upstream: ClientConnection) -> None:
    """Frames both ways until either side closes; the client is closed as the upstream was."""
    async with upstream:
        await until_first_done(to_upstream(websocket, upstream), to_client(websocket, upstream))
    code = upstream.close_code or 1000
    sendable = (1000 <= code <= 1014 and code not in (1005, 1006)) or 3000 <= code <= 4999
    await close_websocket(websocket, code if sendable else 1011, upstream.close_reason or "")


async def to_upstream(websocket: WebSocket, upstream: ClientConnection) -> None:
    while (message := await websocket.receive())["type"] == "websocket.receive":
        await upstream.send(message["bytes"] if message.get("bytes") is not None else str(message.get("text") or ""))


async def to_client(websocket: WebSocket, upstream: ClientConnection) -> None:
    try:
        async for message in upstream:
            if isinstance(message, bytes):
                await websocket.send_bytes(message)
            else:
                await websocket.send_text(message)
    except ConnectionClosed:
        pass


async def close_websocket(websocket: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):  # the client left first
        await websocket.close(code=code, reason=reason[:120])
