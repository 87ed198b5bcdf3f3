"""The web console through the fleet's door (``/ui``): each node's own pages, a sandbox's from the node that
holds it, and the live list merged from every node's feed, each row with its node.

The browser carries no bearer token, so ``/ui`` is the console's own door: the login (the fleet's token typed
once) is taken by a node, whose signed session every node accepts (they share the fleet's token, see
:mod:`stasis.console_sessions`); the door checks that session itself before it looks up anything (a lookup may
bring a sandbox back from the store), and sends a node only paths rebuilt from checked segments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import httpx
from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake

from ..console_sessions import COOKIE, LIFETIME_SECS, Sessions
from ..errors import DaemonUnavailable, StasisError
from ..origin import same_origin
from .nodes import Nodes, checked
from .requests import REPLAYABLE, replayable
from .sockets import MAX_MESSAGE, OPEN_TIMEOUT, relay

log = logging.getLogger(__name__)

OPEN = ("login", "static")  # what is served before any login: the form (a node's page, the door's check), its files
PASSED = ("cookie", "content-type", "accept", "x-stasis-csrf", "x-requested-with")
HEARTBEAT = 15.0  # seconds of quiet before the merged feed says it is alive
KEPT = ("content-type", "location", "set-cookie", "cache-control", "content-disposition")


def console_routes(app: FastAPI, nodes: Nodes, token: str) -> None:
    sessions = Sessions(tokens={token})
    sessions.keyed_by(token)

    @app.post("/v1/console/tokens", include_in_schema=False)
    async def console_token() -> dict[str, str]:
        """`stasis ui` through the fleet: a login token for the door's console only (never the fleet's own, which
        would land in a browser's history), good for 12 hours."""
        return {"token": sessions.login_token()}  # signed, not kept: nothing grows with each call

    @app.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        """Taken here, not by a node: the door signs the session every node accepts (one key, the fleet's token)."""
        if not replayable(request):
            return JSONResponse({"error": "a login form is small"}, status_code=413)
        form = await request.form()
        session = sessions.login(str(form.get("token") or ""))
        if session is None:
            return RedirectResponse("/ui/login?failed=1", status_code=303)
        response = RedirectResponse("/ui/", status_code=303)
        response.set_cookie(COOKIE, session.id, max_age=LIFETIME_SECS, httponly=True, samesite="strict", path="/ui")
        return response

    @app.get("/ui", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.api_route("/ui/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
    async def page(request: Request, rest: str) -> Response:
        parts = rest.split("/")
        signed_in = sessions.get(request.cookies.get(COOKIE)) is not None
        if not signed_in and parts[0] not in OPEN:
            if request.method == "GET" and parts[0] != "events":
                return RedirectResponse("/ui/login", status_code=303)
            return JSONResponse({"error": "log in first (the session is missing or expired)"}, status_code=401)
        path = "/ui/" + "/".join(checked(part) for part in parts if part) + ("/" if rest.endswith("/") else "")
        if parts[0] == "events":
            return StreamingResponse(_merged_feed(nodes, request.headers.get("cookie", "")),
                                     media_type="text/event-stream", headers={"cache-control": "no-store"})  # fmt: skip
        if parts[0] == "logout" and request.method == "POST":
            sessions.logout(request.cookies.get(COOKIE))
            for node in await nodes.live():  # every node forgets it (the door already did)
                with contextlib.suppress(httpx.HTTPError):
                    await nodes.client(node).post(path, headers=_passed(request))
        if not replayable(request) and not (parts[0] == "sandboxes" and parts[-1] == "upload"):
            too_large = f"a console request's body is at most {REPLAYABLE >> 20} MiB"
            return JSONResponse({"error": too_large}, status_code=413)
        return await _forward(nodes, await _node_for(nodes, parts), request, path)

    @app.websocket("/ui/sandboxes/{ref}/{rest:path}")
    async def websocket(websocket: WebSocket, ref: str, rest: str) -> None:
        if not same_origin(websocket) or sessions.get(websocket.cookies.get(COOKIE)) is None:
            await websocket.close(code=4401, reason="log in first (the console's own page opens this)")
            return
        try:
            node = await nodes.holder("sandboxes", checked(ref))
            path = "/ui/sandboxes/" + "/".join(checked(p) for p in [ref, *rest.split("/")] if p)
        except StasisError as exc:
            await websocket.close(code=4400, reason=exc.message[:120])
            return
        query = urlencode(list(websocket.query_params.multi_items()))
        url = node["url"].replace("http://", "ws://", 1) + path + (f"?{query}" if query else "")
        headers = {"cookie": websocket.headers.get("cookie", ""), "origin": node["url"]}  # checked here, above
        try:
            upstream = await connect(url, additional_headers=headers, proxy=None, max_size=MAX_MESSAGE, max_queue=4,
                                     open_timeout=OPEN_TIMEOUT)  # fmt: skip
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            await websocket.close(code=4502, reason=f"node {node['name']}: {exc}"[:120])
            return
        await websocket.accept()
        await relay(websocket, upstream)


async def _node_for(nodes: Nodes, parts: list[str]) -> dict[str, Any]:
    """The node a page is about: a sandbox's or a checkpoint's holder, else any live one."""
    if len(parts) >= 2 and parts[1] and parts[0] in ("sandboxes", "checkpoints"):
        return await nodes.holder(parts[0], checked(parts[1]))  # never a resume from the store: a page only looks
    live = await nodes.live()
    if not live:
        raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
    return live[0]


def _passed(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() in PASSED}


async def _forward(nodes: Nodes, node: dict[str, Any], request: Request, path: str) -> Response:
    client = nodes.client(node)
    body = await request.body() if replayable(request) else request.stream()  # an upload streams through
    sent = client.build_request(request.method, path, params=request.query_params, content=body,
                                headers=_passed(request))  # fmt: skip
    answer = await client.send(sent, stream=True, follow_redirects=False)
    kept = [(k, v) for k, v in answer.headers.multi_items() if k.lower() in KEPT]
    response = StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                 background=BackgroundTask(answer.aclose))  # fmt: skip
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in kept]
    return response


async def _merged_feed(nodes: Nodes, cookie: str) -> AsyncIterator[bytes]:
    """Every live node's live feed as one: each time a node sends its sandboxes, all nodes' latest, each row
    with its node."""
    latest: dict[str, list[dict[str, Any]]] = {}
    changed: asyncio.Queue[None] = asyncio.Queue()

    async def follow(node: dict[str, Any]) -> None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            async with nodes.client(node).stream("GET", "/ui/events", headers={"cookie": cookie}) as answer:
                async for line in answer.aiter_lines():
                    if line.startswith("data: "):
                        rows = json.loads(line[6:])
                        latest[node["name"]] = [{**row, "node": node["name"]} for row in rows if isinstance(row, dict)]
                        changed.put_nowait(None)
        latest.pop(node["name"], None)  # its feed ended: its rows are no longer known
        changed.put_nowait(None)

    following = [asyncio.create_task(follow(node)) for node in await nodes.live()]
    try:
        while not all(task.done() for task in following):
            try:
                await asyncio.wait_for(changed.get(), HEARTBEAT)
            except TimeoutError:
                yield b": alive\n\n"  # an SSE comment: the browser's connection stays open, nothing changes
                continue
            rows = [row for name in sorted(latest) for row in latest[name]]
            yield b"data: " + json.dumps(rows).encode() + b"\n\n"
    finally:
        for task in following:
            task.cancel()
