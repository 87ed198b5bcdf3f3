"""E2B's API in front of a fleet (`stasis e2b serve` with ``STASIS_FLEET``, or ``--fleet``): one listener in the
door; behind it each node's own E2B face (:mod:`.e2b_faces`). A request about a sandbox (its envd, its ports,
its control-plane routes) goes to the node that holds it, brought back from the store when no live node does;
a create goes where placement says (a snapshot's restore where the snapshot is); a listing is every node's,
merged in E2B's order; a secret's change reaches every node.

Credentials are checked here before any lookup, as one daemon's face does: the API key (the fleet's token), or
the sandbox's envd or traffic token (derived from that key). A request with neither is only sent on to a node
that already holds the sandbox (a port of one made with ``allowPublicTraffic`` needs none; the node decides),
and never brings one back from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidHandshake
from websockets.typing import Subprotocol

from ..body_limits import BodyLimit, e2b_upload
from ..e2b_models import E2bServeRequest
from ..e2b_signatures import FILES_PATH, signed_with, signer
from ..e2b_wire import (
    API_KEY_HEADER,
    ENVD_PORT,
    PORT_HEADER,
    SANDBOX_HEADER,
    TOKEN_HEADER,
    TRAFFIC_TOKEN_HEADER,
    UNAUTHORIZED,
    derived_token,
    local_domain,
    sandbox_target,
)
from ..errors import CheckpointNotFound, InvalidRequest, StasisError, clip
from .e2b_faces import NodeFaces
from .nodes import REF, Nodes, checked
from .placement import place
from .requests import small_json
from .sockets import MAX_MESSAGE, OPEN_TIMEOUT, relay

log = logging.getLogger(__name__)

HEARTBEAT = 15.0
SANDBOX_ID_PREFIX = "sb-"
SIGNED_CANDIDATES = 4096  # a header-less signed URL is matched among the sandboxes the door knew last, this many
PASSED_ON = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
                       "content-length", "proxy-authorization"})  # not authorization: envd's user is in it  # fmt: skip
WEBSOCKET_OWN = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                           "sec-websocket-protocol"})  # fmt: skip


def e2b_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": clip(message)}, status_code=status)


def e2b_routes(app: FastAPI, nodes: Nodes, token: str) -> None:
    """The door's ``/v1/e2b/serve``: the router's listener, open while the caller's stream is."""

    @app.post("/v1/e2b/serve")
    async def serve(request: E2bServeRequest) -> StreamingResponse:
        faces = NodeFaces(nodes, request.model_dump(mode="json"))
        router = FleetE2b(nodes, faces, token, request.domain)
        server, sock, ticking = await _listen(router, request.listen)
        host, port = sock.getsockname()[:2]
        # get_host names the door's listener (every node's face is told so before any is opened)
        router.domain = faces.ask["domain"] = request.domain or local_domain(host, port)
        url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        log.info("the fleet's E2B face listens on %s", url)

        async def lines() -> AsyncIterator[str]:
            try:
                exports = {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": token}
                yield json.dumps({"listening": url, "exports": exports, "domain": router.domain}) + "\n"
                while True:
                    await asyncio.sleep(HEARTBEAT)
                    yield json.dumps({"alive": True}) + "\n"
            finally:
                with anyio.CancelScope(shield=True):  # the caller left: this runs in a cancelled scope
                    server.should_exit = True
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticking
                    await server.shutdown(sockets=[sock])
                    await faces.close()
                log.info("the fleet's E2B face on %s closed", url)

        return StreamingResponse(lines(), media_type="application/x-ndjson")


async def _listen(app: FleetE2b, listen: str) -> tuple[uvicorn.Server, socket.socket, asyncio.Task[None]]:
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidRequest(f"listen {listen[:80]!r}: give HOST:PORT, e.g. 127.0.0.1:3000")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --listen") from None
    sock.listen(128)
    sock.setblocking(False)
    config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=5)
    config.load()
    server = uvicorn.Server(config)
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=[sock])  # not serve(): the door's process owns the signal handlers
    return server, sock, asyncio.create_task(server.main_loop())


class FleetE2b:
    def __init__(self, nodes: Nodes, faces: NodeFaces, token: str, domain: str | None) -> None:
        self.nodes, self.faces, self.token, self.domain = nodes, faces, token, domain
        self.control = _control_app(nodes, faces, token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return
        headers = Headers(scope=scope)
        target = sandbox_target(headers, self.domain) or self._signed_target(scope)
        if target is None:
            await self.control(scope, receive, send)
            return
        ref, port = target
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if not raw_path.startswith(b"/") or raw_path.startswith(b"//"):  # an absolute-form target: never a URL
            await _refuse(scope, receive, send, 400, "the request's target must be a path (/...)")
            return
        try:
            client = await self.faces.client(await self._holder(headers, checked(ref), scope, port))
        except StasisError as exc:
            await _refuse(scope, receive, send, exc.status_code, exc.message)
            return
        except httpx.HTTPError as exc:
            await _refuse(scope, receive, send, 502, f"the sandbox's node did not answer: {exc}")
            return
        # named in headers from here: the node's face needs no domain, and the Host is the node's
        kept = [(k, v) for k, v in scope["headers"] if k.decode().lower() not in (SANDBOX_HEADER, PORT_HEADER, "host")]
        named = [(SANDBOX_HEADER.encode(), ref.encode()), (PORT_HEADER.encode(), str(port).encode())]
        scope = {**scope, "headers": kept + named}
        if scope["type"] == "websocket":
            await _relay_websocket(client, scope, receive, send)
        else:
            await _proxy(client, Request(scope, receive), send, scope, receive)

    async def _holder(self, headers: Headers, ref: str, scope: Scope, port: int) -> dict[str, Any]:
        """The node of ``ref``: with a credential, wherever it is (back from the store if need be); without one
        (a public sandbox's port), only the node the door already knows holds it, asking no node, and otherwise
        refused in the words a node uses for a wrong token."""
        if self._credited(headers, ref) or self._signed(scope, ref, port):
            return await self.nodes.found("sandboxes", ref)
        if (node := self.nodes.cached(ref)) is None:  # no lookup for whoever has no credential
            raise _Unauthorized(UNAUTHORIZED)
        return node

    def _signed(self, scope: Scope, ref: str, port: int) -> bool:
        """A signed file URL of ``ref`` (envd's /files, its one file and operation): the node checks it again."""
        if port != ENVD_PORT or scope["type"] != "http":
            return False
        token = derived_token(self.token, "envd", ref)
        return signed_with(token, scope["method"], scope["path"], scope.get("query_string", b""))

    def _signed_target(self, scope: Scope) -> tuple[str, int] | None:
        """A signed file URL that names no sandbox: the one, among those the door knows, whose token signed it."""
        if scope["type"] != "http" or scope.get("path") != FILES_PATH:
            return None
        known = [ref for ref in reversed(self.nodes.remembered()) if ref.startswith(SANDBOX_ID_PREFIX)]
        candidates = ((ref, derived_token(self.token, "envd", ref)) for ref in known[:SIGNED_CANDIDATES])
        ref = signer(candidates, scope["method"], FILES_PATH, scope.get("query_string", b""))
        return None if ref is None else (ref, ENVD_PORT)

    def _credited(self, headers: Headers, ref: str) -> bool:
        if _same(headers.get(API_KEY_HEADER), self.token):
            return True
        presented = (headers.get(TOKEN_HEADER), headers.get(TRAFFIC_TOKEN_HEADER))
        wanted = (derived_token(self.token, "envd", ref), derived_token(self.token, "traffic", ref))
        return any(_same(given, expected) for given in presented for expected in wanted)


class _Unauthorized(StasisError):
    status_code = 401


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _control_app(nodes: Nodes, faces: NodeFaces, token: str) -> FastAPI:
    app = FastAPI(title="stasis fleet: E2B's API", openapi_url=None, docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def api_key(request: Request, call_next):  # type: ignore[no-untyped-def]
        if not _same(request.headers.get(API_KEY_HEADER), token):
            return e2b_error(401, "Invalid API key: use the E2B_API_KEY that `stasis e2b serve` printed")
        return await call_next(request)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return e2b_error(exc.status_code, str(exc))

    app.add_middleware(BodyLimit, streamed=e2b_upload)  # outermost, before the key: a body within its bound
    _merged_routes(app, nodes, faces)
    _routed_routes(app, nodes, faces)
    return app


def _merged_routes(app: FastAPI, nodes: Nodes, faces: NodeFaces) -> None:
    """What is every node's: a create placed, listings merged, secrets changed on all."""

    @app.post("/sandboxes")
    @app.post("/v2/sandboxes")
    async def create(request: Request) -> Response:
        body = await small_json(request)
        template = body.get("templateID") if isinstance(body, dict) else None
        node = place(await nodes.live(), await _snapshot_holder(nodes, template))
        client = await faces.client(node)
        answer = await client.post(request.url.path, content=json.dumps(body), headers=_passed_on(request.headers))
        if answer.status_code == 201:
            nodes.remember(node["name"], answer.json().get("sandboxID"))
        return _whole(answer)

    @app.get("/v2/sandboxes")
    async def list_v2(request: Request) -> Response:
        answers = await _everyone(nodes, faces, request)
        newest_first = request.query_params.get("order", "desc") != "asc"  # as each node pages them
        rows = sorted((row for a in answers for row in a.json()), key=lambda r: (r["startedAt"], r["sandboxID"]),
                      reverse=newest_first)  # fmt: skip
        limit = (
            int(request.query_params.get("limit", "100")) if request.query_params.get("limit", "").isdigit() else 100
        )
        page, more = rows[:limit], len(rows) > limit or any("x-next-token" in a.headers for a in answers)
        headers = {"x-next-token": f"{page[-1]['startedAt']}|{page[-1]['sandboxID']}"} if more and page else {}
        return JSONResponse(page, headers=headers)

    @app.get("/sandboxes")
    @app.get("/snapshots")
    async def list_all(request: Request) -> Response:
        if (sandbox := request.query_params.get("sandboxID")) is not None:  # one sandbox's snapshots: its node's
            return await _forward(faces, request, await nodes.found("sandboxes", checked(sandbox)))
        return JSONResponse([row for a in await _everyone(nodes, faces, request) for row in a.json()])

    _secret_routes(app, nodes, faces)


def _secret_routes(app: FastAPI, nodes: Nodes, faces: NodeFaces) -> None:

    changing = asyncio.Lock()

    @app.post("/secrets")
    @app.api_route("/secrets/{secret_id}", methods=["POST", "DELETE"])
    async def change_secret(request: Request, secret_id: str | None = None) -> Response:
        """Every live node in turn (a sandbox may run on any); the first refusal stops it and is said."""
        body, answer = await request.body(), None
        async with changing:
            for node in await nodes.live():
                client = await faces.client(node)
                answer = await client.request(request.method, request.url.path, content=body,
                                              headers=_passed_on(request.headers))  # fmt: skip
                if not answer.is_success:
                    return _whole(answer)
        return _whole(answer) if answer is not None else e2b_error(503, "no live node in the fleet")

    @app.get("/secrets")
    @app.get("/secrets/{secret_id}")
    async def read_secrets(request: Request, secret_id: str | None = None) -> Response:
        live = await nodes.live()
        return await _forward(faces, request, live[0]) if live else e2b_error(503, "no live node in the fleet")


def _routed_routes(app: FastAPI, nodes: Nodes, faces: NodeFaces) -> None:
    """One sandbox's or snapshot's routes, to its node."""

    @app.post("/v3/templates")
    @app.api_route("/v2/templates/{rest:path}", methods=["GET", "POST"])
    @app.api_route("/templates/tags", methods=["POST", "DELETE"])
    @app.api_route("/templates/{rest:path}", methods=["GET", "PUT", "POST"])
    async def template_builds(request: Request, rest: str = "") -> Response:
        return e2b_error(501, "E2B's Template builds are one daemon's, not yet a fleet's: build on a node's own face "
                         "(`stasis e2b serve` with that node's STASIS_URL); its images stay on that node")  # fmt: skip

    @app.api_route("/volumes", methods=["GET", "POST"])
    @app.api_route("/volumes/{rest:path}", methods=["GET", "DELETE"])
    @app.api_route("/volumecontent/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def volumes(request: Request, rest: str = "") -> Response:
        return e2b_error(501, "volumes are one daemon's, not yet a fleet's: use a node's own face (`stasis e2b serve` "
                         "with that node's STASIS_URL), and create the sandboxes that mount them there")  # fmt: skip

    @app.delete("/templates/{template_id}")
    async def delete_snapshot(request: Request, template_id: str) -> Response:
        return await _forward(faces, request, await nodes.holder("checkpoints", checked(template_id)))

    @app.api_route("/sandboxes/{sandbox_id}", methods=["GET", "DELETE"])
    @app.api_route("/sandboxes/{sandbox_id}/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    @app.api_route("/v2/sandboxes/{sandbox_id}/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def one(request: Request, sandbox_id: str, rest: str = "") -> Response:
        node = await nodes.found("sandboxes", checked(sandbox_id))
        if request.method == "DELETE" and not rest:
            nodes.forget(sandbox_id)
        return await _forward(faces, request, node)

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def anything_else(request: Request, rest: str) -> Response:
        return e2b_error(404, f"{request.method[:16]} /{rest[:80]}: not part of E2B's API as a stasis fleet serves it")


async def _forward(faces: NodeFaces, request: Request, node: dict[str, Any]) -> Response:
    return await _proxy_response(await faces.client(node), request)


async def _snapshot_holder(nodes: Nodes, template: object) -> str | None:
    """The node holding the snapshot a create names (E2B's ``templateID`` may be one), or None."""
    if not isinstance(template, str) or not REF.fullmatch(template) or ".." in template:
        return None
    with contextlib.suppress(CheckpointNotFound):
        return str((await nodes.holder("checkpoints", template))["name"])
    return None


async def _everyone(nodes: Nodes, faces: NodeFaces, request: Request) -> list[httpx.Response]:
    """Every live node's face's answer to this GET; a node's refusal is the answer."""
    live = await nodes.live()
    clients = [await faces.client(node) for node in live]
    headers = _passed_on(request.headers)
    answers = await asyncio.gather(*(c.get(request.url.path, params=request.query_params, headers=headers)
                                     for c in clients))  # fmt: skip
    for answer in answers:
        if not answer.is_success:
            raise _Relayed(answer)
    return list(answers)


class _Relayed(StasisError):
    def __init__(self, answer: httpx.Response) -> None:
        body = answer.json() if answer.headers.get("content-type", "").startswith("application/json") else {}
        super().__init__(str(body.get("message") or answer.text[:300]))
        self.status_code = answer.status_code


def _passed_on(headers: Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in PASSED_ON}


def _upstream(client: httpx.AsyncClient, scope: Scope) -> httpx.URL:
    """The node face's URL for this request: its raw path and query as sent (checked to be a path), on the
    face's own address."""
    raw = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string", b"")
    return client.base_url.copy_with(raw_path=raw + (b"?" + query if query else b""))


async def _proxy_response(client: httpx.AsyncClient, request: Request) -> Response:
    headers = _passed_on(request.headers)
    headers.setdefault("accept-encoding", "identity")  # what the client asked for, never httpx's own default
    upstream = client.build_request(request.method, _upstream(client, request.scope), content=request.stream(),
                                    headers=headers)  # fmt: skip
    answer = await client.send(upstream, stream=True)
    kept = {k: v for k, v in answer.headers.items() if k.lower() not in PASSED_ON}
    return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=kept,
                             background=BackgroundTask(answer.aclose))  # fmt: skip


async def _proxy(client: httpx.AsyncClient, request: Request, send: Send, scope: Scope, receive: Receive) -> None:
    try:
        response = await _proxy_response(client, request)
    except httpx.HTTPError as exc:
        response = e2b_error(502, f"the sandbox's node did not answer: {exc}")
    await response(scope, receive, send)


def _whole(answer: httpx.Response) -> Response:
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in PASSED_ON}
    return Response(answer.content, status_code=answer.status_code, headers=headers)


async def _relay_websocket(client: httpx.AsyncClient, scope: Scope, receive: Receive, send: Send) -> None:
    websocket = WebSocket(scope, receive, send)
    headers = {k: v for k, v in websocket.headers.items() if k.lower() not in PASSED_ON | WEBSOCKET_OWN}
    url = str(_upstream(client, scope).copy_with(scheme="ws"))
    try:
        upstream = await connect(url, additional_headers=headers, proxy=None,
                                 subprotocols=[Subprotocol(p) for p in scope.get("subprotocols", [])] or None,
                                 max_size=MAX_MESSAGE, max_queue=4, open_timeout=OPEN_TIMEOUT)  # fmt: skip
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        await websocket.close(code=1011, reason=f"the sandbox's node: {exc}"[:120])
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    await relay(websocket, upstream)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    await e2b_error(status, message)(scope, receive, send)
