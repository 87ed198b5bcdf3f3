"""The fleet's front door: the daemon's own HTTP API, in front of every node's daemon. A create is placed
(:mod:`.placement`) with its name checked fleet-wide; a request about one sandbox or checkpoint goes to the
node that holds it; a listing is every node's, each sandbox with its ``node``. The SDKs and the CLI talk to
it as to one daemon (``STASIS_FLEET=URL`` with ``STASIS_TOKEN``). What it does not route yet is refused with
a 501 saying so, never answered by one node as if it were the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .. import __version__
from ..body_limits import BodyLimit
from ..errors import (
    CheckpointNotFound,
    Conflict,
    DaemonUnavailable,
    InvalidRequest,
    NameTaken,
    SandboxNotFound,
    StasisError,
    Unsupported,
    error_from_payload,
)
from ..models import TEMPLATE_PREFIX
from . import quotas, tenants
from .console import console_routes
from .e2b import e2b_routes
from .forks import fork_routes, found
from .nodes import Nodes, SandboxLost, checked, node_path
from .placement import place
from .pools import pool_routes
from .requests import REPLAYABLE
from .requests import replayable as _replayable
from .requests import small_json as _small_json
from .sockets import websocket_routes
from .tenants import as_caller
from .waiting import waiting_in_store

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length",
              "authorization", "proxy-authorization"}  # fmt: skip
DESCRIBES_A_SANDBOX = re.compile(r"^/v1/sandboxes/[^/]+(/(suspend|resume))?$")
KillNode = Callable[[str], Awaitable[None]]
log = logging.getLogger(__name__)


def error(exc: StasisError) -> JSONResponse:
    return JSONResponse(exc.to_payload(), status_code=exc.status_code)


def create_door(nodes: Nodes, token: str, kill_node: KillNode | None = None) -> FastAPI:
    """The front door's app. ``kill_node`` (a local fleet's) removes a node as a host's loss would."""
    app = FastAPI(title="stasis fleet", version=__version__, openapi_url=None, docs_url=None, redoc_url=None)
    keys = tenants.Keys(nodes)
    nodes.on_join = lambda node, reference: tenants.welcome(nodes, node, reference)

    @app.middleware("http")
    async def bearer(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.scope["path"] == "/ui" or request.scope["path"].startswith("/ui/"):  # the console's: its own login
            return await call_next(request)
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return await call_next(request)
        if not tenants.KEY.fullmatch(given.removeprefix("Bearer ")):
            return JSONResponse({"type": "Unauthorized", "message": "the fleet wants its token (or a team's key): "
                                 "set STASIS_TOKEN", "details": {}}, status_code=401)  # fmt: skip
        try:
            who = await keys.who(given.removeprefix("Bearer "))
            if not tenants.key_may(request.method, request.scope["path"]):
                raise tenants.refuse_key(request.scope["path"])
        except StasisError as exc:
            return error(exc)
        request.state.key, request.state.team = given.removeprefix("Bearer "), who["team"]
        request.state.scopes = set(who["scopes"])
        return await call_next(request)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> JSONResponse:
        return error(exc)

    @app.on_event("shutdown")
    async def closing() -> None:
        await nodes.close()

    app.add_middleware(BodyLimit)  # outermost: a body past its bound is refused before anything holds it
    websocket_routes(app, nodes, token, keys)
    console_routes(app, nodes, token)
    _fleet_routes(app, nodes, kill_node)
    _sandbox_routes(app, nodes)
    fork_routes(app, nodes)
    _secret_routes(app, nodes)
    tenants.team_routes(app, nodes)
    pool_routes(app, nodes)
    e2b_routes(app, nodes, token)
    _routed_routes(app, nodes)
    return app


def _fleet_routes(app: FastAPI, nodes: Nodes, kill_node: KillNode | None) -> None:
    """The door's own: health, and the nodes."""

    @app.get("/v1/health")
    async def health(request: Request) -> dict[str, Any]:
        described = await nodes.describe()
        first = next((n for n in described if n["state"] == "up"), None)
        backends = {}
        if first is not None:
            backends = (await nodes.client(first).get("/v1/health")).json().get("backends", {})
        if tenant := tenants.key_of(request):  # a team's key learns which backends there are, not the hosts' details
            backends = {name: {} for name in backends}
        return {
            "version": __version__,
            "pid": 0,
            "home": "fleet",
            "backends": backends,
            "fleet": True,
            "nodes": {} if tenant else {n["name"]: n["state"] for n in described},
        }

    @app.get("/v1/fleet/nodes")
    async def list_nodes() -> list[dict[str, Any]]:
        return await nodes.describe()

    @app.post("/v1/fleet/nodes/{name}/leave")
    async def leave(name: str) -> dict[str, Any]:
        """A node leaves on purpose (`stasis fleet leave`): its sandboxes handed to the store, then its daemon
        stopped; its `stasis fleet join` (or local fleet) then stops its raylet."""
        if name not in nodes.known():
            await nodes.describe()
        node = nodes.known().get(name)
        if node is None or node["state"] != "up":
            state = node["state"] if node else "not in the fleet"
            raise InvalidRequest(f"node {name[:80]!r} is {state}; `stasis fleet nodes` lists the live ones")
        nodes.mark(name, "leaving")  # from now no create goes there, and a describe failing meanwhile is no loss
        result: dict[str, Any] = await nodes.agent(name).leave.remote()
        if result["left"]:
            nodes.mark(name, "left")
        else:
            await nodes.describe()
            kept = "; ".join(f"{ref}: {why[:120]}" for ref, why in list(result["kept"].items())[:5])
            raise Conflict(f"node {name} stays: {len(result['kept'])} could not be handed to the store ({kept}); "
                           "fix that and leave again", kept=result["kept"])  # fmt: skip
        return result

    @app.delete("/v1/fleet/nodes/{name}")
    async def remove_node(name: str) -> dict[str, Any]:
        if kill_node is None:
            raise Unsupported("only a local fleet (`stasis fleet local`) can remove a node; on a real fleet, "
                              "stop the host (or `stasis fleet leave` there)")  # fmt: skip
        if name not in nodes.known():
            await nodes.describe()
        if name not in nodes.known():
            raise Unsupported(f"no node named {name[:80]!r} in the fleet; `stasis fleet nodes` lists them")
        await kill_node(name)
        await nodes.describe()  # it is lost now: what it held is looked for elsewhere
        return {"removed": name}


def _sandbox_routes(app: FastAPI, nodes: Nodes) -> None:
    """Listings merged from every node, a create placed."""
    creating = asyncio.Lock()  # a name is checked on every node, then taken: one create at a time does both

    @app.get("/v1/sandboxes")
    async def list_sandboxes(request: Request) -> list[dict[str, Any]]:
        every = request.query_params.get("all", "false").lower() in ("1", "true", "yes")
        found = await _gather(nodes, "/v1/sandboxes" + ("?all=true" if every else ""), as_caller(request))
        here = {s["id"] for s in found} | {s["name"] for s in found if s.get("name")}
        waiting = [s for s in await waiting_in_store(nodes)
                   if _team(request) is None or (s.get("spec") or {}).get("team") == _team(request)]  # fmt: skip
        found += [s for s in waiting if s["id"] not in here and s.get("name") not in here]
        merged = sorted(found, key=lambda s: (s["created_at"], s["id"]))
        if (after := request.query_params.get("after")) is not None:
            last = next((s for s in merged if s["id"] == after), None)
            merged = [s for s in merged if last is None or (s["created_at"], s["id"]) > (last["created_at"], after)]
        if (limit := request.query_params.get("limit")) is not None and limit.isdigit():
            merged = merged[: int(limit)]
        return merged

    @app.get("/v1/checkpoints")
    async def list_checkpoints(request: Request) -> list[dict[str, Any]]:
        return sorted(await _gather(nodes, "/v1/checkpoints", as_caller(request)), key=lambda c: c["created_at"])

    @app.post("/v1/sandboxes")
    async def create(request: Request) -> Response:
        body = await _small_json(request)
        wanted = body.pop("node", None) if isinstance(body, dict) else None
        name = body.get("name") if isinstance(body, dict) else None
        if wanted is None and isinstance(body, dict):
            wanted = await _holder_of_source(nodes, body, as_caller(request))
        async with creating if name else contextlib.nullcontext():  # only a name is checked, then taken, at once
            if name:
                holders = [n for n, held in await _holders(nodes, checked(name)) if held]
                if holders:
                    where = "" if tenants.key_of(request) else f" (on node {holders[0]['name']})"
                    raise NameTaken(f"a sandbox named {name!r} already exists in the fleet{where}; pick another name "
                                    f"or remove it with `stasis rm {name}`", name=name)  # fmt: skip
            async with quotas.admitted(nodes, request, body):
                node = place(await nodes.live(), wanted)
                answer = await nodes.client(node).post("/v1/sandboxes", json=body, headers=as_caller(request))
        if answer.status_code == 201:
            made = answer.json()
            nodes.remember(node["name"], made["id"], made.get("name"))
            return JSONResponse({**made, "node": node["name"]}, status_code=201)
        return _relay_whole(answer)


def _secret_routes(app: FastAPI, nodes: Nodes) -> None:
    """Secrets are the fleet's: added, rotated and removed on every live node (a sandbox may run, or move, on any),
    read from one."""

    changing = asyncio.Lock()  # one change at a time reaches every node, so all apply them in one order

    @app.api_route("/v1/secrets/{name}", methods=["PUT", "DELETE"])
    async def change_secret(request: Request, name: str) -> Response:
        live = await nodes.live()
        if not live:
            raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
        body, path = await request.body(), f"/v1/secrets/{checked(name)}"
        if len(body) > REPLAYABLE:
            raise InvalidRequest(f"a secret's request is at most {REPLAYABLE >> 20} MiB")
        async with changing:
            answers = await asyncio.gather(
                *(nodes.client(n).request(request.method, path, content=body, headers=_forwarded(request))
                  for n in live),
                return_exceptions=True,
            )  # fmt: skip
        failed = [(n["name"], a) for n, a in zip(live, answers, strict=True)
                  if isinstance(a, BaseException) or not a.is_success]  # fmt: skip
        if failed and len(failed) < len(live):  # some have it and some not: say which, never half silently
            first = failed[0][1]
            why = str(first) if isinstance(first, BaseException) else first.text
            where = ", ".join(n for n, _ in failed)
            raise StasisError(f"secret {name!r}: {request.method} failed on node(s) {where}: {why[:200]}; run it again")
        if isinstance(answers[0], BaseException):
            raise DaemonUnavailable(f"no node took the change of secret {name!r}: {answers[0]}")
        return _relay_whole(answers[0])

    @app.get("/v1/secrets")
    @app.get("/v1/secrets/{name}")
    async def read_secrets(request: Request, name: str | None = None) -> Response:
        live = await nodes.live()
        if not live:
            raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
        path = "/v1/secrets" + (f"/{checked(name)}" if name else "")
        return _relay_whole(await nodes.client(live[0]).get(path, headers=as_caller(request)))  # a key: its team's


def _routed_routes(app: FastAPI, nodes: Nodes) -> None:
    """One sandbox's or checkpoint's calls, to the node that holds it; a move between two nodes."""

    @app.post("/v1/sandboxes/{ref}/move")
    async def move(ref: str, request: Request) -> Response:
        """Suspended and pushed to the store on its node, pulled and resumed on the other: processes kept."""
        wanted = (await _small_json(request) or {}).get("node")
        tenants.require(request, "write")  # a key's own sandbox (looked for with the key), moved by the fleet
        source = await found(nodes, request, "sandboxes", ref)
        live = await nodes.live()
        target = place(live, wanted) if wanted else place([n for n in live if n["name"] != source["name"]])
        if target["name"] == source["name"]:
            answer = await nodes.client(source).get(f"/v1/sandboxes/{ref}")
            return (
                JSONResponse({**answer.json(), "node": source["name"]}) if answer.is_success else _relay_whole(answer)
            )
        async with quotas.admitted(nodes, request, resuming=ref):  # one suspended starts again over there
            pushed = await nodes.client(source).post("/v1/remote/push", json={"ref": ref, "kind": "sandbox"})
            if not pushed.is_success:
                return _relay_whole(pushed)
            sandbox_id = pushed.json()["id"]
            nodes.forget(ref, sandbox_id)
            for step in ("/v1/remote/pull", f"/v1/sandboxes/{sandbox_id}/resume"):
                body = {"ref": sandbox_id, "kind": "sandbox"} if step.endswith("pull") else None
                answer = await nodes.client(target).post(step, json=body)
                if not answer.is_success:
                    return _relay_whole(answer)
            moved = answer.json()
            nodes.remember(target["name"], sandbox_id, moved.get("name"))
            return JSONResponse({**moved, "node": target["name"]})

    @app.api_route("/v1/{kind}/{ref}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    @app.api_route("/v1/{kind}/{ref}/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def one(request: Request, kind: str, ref: str, rest: str = "") -> Response:
        if kind not in ("sandboxes", "checkpoints"):
            return _not_routed(request)
        path = node_path(kind, ref, rest)  # rebuilt from checked segments: never another endpoint of the node
        resuming = kind == "sandboxes" and rest == "resume" and request.method == "POST"
        try:
            async with quotas.admitted(nodes, request, resuming=ref) if resuming else contextlib.nullcontext():
                answer = await _routed(nodes, request, kind, ref, rest, path)
        except (SandboxNotFound, CheckpointNotFound, SandboxLost):
            if tenants.key_of(request) is None:
                raise
            raise tenants.not_found(kind, ref) from None  # the door's own words, whatever a node said or knew
        if isinstance(answer, Response):  # streamed up and back (an upload), or a sandbox described with its node
            return answer
        if tenants.key_of(request) and answer.status_code == 404 and await _gone(answer):
            raise tenants.not_found(kind, ref)
        return _relay_whole(answer) if answer.is_stream_consumed else _streamed(answer)

    @app.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def anything_else(request: Request, rest: str) -> Response:
        parts = rest.split("/")
        if request.method == "GET" and parts[:2] in (["v1", "images"], ["v1", "info"]):
            live = await nodes.live()
            if live:  # every node of a local fleet shares the image directory; a real one's are built alike
                path = "/" + "/".join(checked(part) for part in parts)
                return await _forward(nodes.client(live[0]), request, path)
        return _not_routed(request)


async def _routed(nodes: Nodes, request: Request, kind: str, ref: str, rest: str, path: str) -> Any:
    """A request about one sandbox or checkpoint sent to its node: the node's answer (or one made here)."""
    if not _replayable(request):  # an upload: its node asked first, the body streamed through once
        return await _forward(nodes.client(await nodes.found(kind, ref, as_caller(request))), request, path)
    body = await request.body()
    cached = nodes.cached(ref)
    node = cached or await nodes.found(kind, ref, as_caller(request))
    try:
        answer = await _send(nodes.client(node), request, body, path)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: its daemon is gone (a host's loss)
        nodes.mark_lost(node, str(exc))
        answer = None
    if answer is None or (cached is not None and await _gone(answer)):  # not where it was: ask all once more
        if answer is not None and tenants.key_of(request) is None:  # a key never makes the door forget
            nodes.forget(ref)
        node = await nodes.found(kind, ref, as_caller(request))
        answer = await _send(nodes.client(node), request, body, path)
    if request.method == "DELETE" and kind == "sandboxes" and not rest and answer.status_code == 200:
        nodes.forget(ref)
    if DESCRIBES_A_SANDBOX.match(path) and answer.status_code == 200:
        await answer.aread()
        await answer.aclose()
        return JSONResponse({**answer.json(), "node": node["name"]})
    return answer


async def _gather(nodes: Nodes, path: str, headers: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every live node's answer to GET ``path`` (a list), each item marked with its node; ``headers``: the
    caller's key, if a team's."""
    live = await nodes.live()
    answers = await asyncio.gather(*(nodes.client(n).get(path, headers=headers) for n in live))
    found = []
    for node, answer in zip(live, answers, strict=True):
        if answer.status_code in (401, 403):  # a key the node no longer takes: its word, not a 500
            raise error_from_payload(answer.json(), answer.status_code)
        answer.raise_for_status()
        for item in answer.json():
            nodes.remember(node["name"], item.get("id"), item.get("name"))
            found.append({**item, "node": node["name"]})
    return found


async def _holder_of_source(nodes: Nodes, body: dict[str, Any], headers: dict[str, str]) -> str | None:
    """A restore goes where its checkpoint (or template's) is; None if no node has it (a node's daemon then
    fetches it from the store, if the fleet has one)."""
    snapshot = body.get("snapshot_id") or (f"{TEMPLATE_PREFIX}{body['template']}" if body.get("template") else None)
    if not isinstance(snapshot, str):
        return None
    try:
        return str((await nodes.holder("checkpoints", snapshot, headers or None))["name"])
    except CheckpointNotFound:
        return None


async def _holders(nodes: Nodes, name: str) -> list[tuple[dict[str, Any], bool]]:
    live = await nodes.live()
    answers = await asyncio.gather(*(nodes.client(n).get(f"/v1/sandboxes/{name}") for n in live))
    return [(n, a.status_code == 200 and a.json().get("status") != "terminated")
            for n, a in zip(live, answers, strict=True)]  # fmt: skip


def _forwarded(request: Request) -> dict[str, str]:
    """The request's headers for a node: a team's key goes along (the node answers as it answers the key)."""
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP} | as_caller(request)


def _team(request: Request) -> str | None:
    return getattr(request.state, "team", None)


async def _gone(answer: httpx.Response) -> bool:
    """Whether a node said it has no such sandbox or checkpoint (not: no such process or file in it)."""
    if answer.status_code != 404:
        return False
    await answer.aread()
    await answer.aclose()
    with contextlib.suppress(ValueError, AttributeError):
        return answer.json().get("type") in ("SandboxNotFound", "CheckpointNotFound")
    return False


async def _forward(client: httpx.AsyncClient, request: Request, path: str) -> Response:
    """The request to the node at ``path``, its body streamed; the answer streamed back as it comes."""
    upstream = client.build_request(request.method, path, params=request.query_params,
                                    content=request.stream(), headers=_forwarded(request))  # fmt: skip
    return _streamed(await client.send(upstream, stream=True))


async def _send(client: httpx.AsyncClient, request: Request, body: bytes, path: str) -> httpx.Response:
    upstream = client.build_request(request.method, path, params=request.query_params, content=body,
                                    headers=_forwarded(request))  # fmt: skip
    return await client.send(upstream, stream=True)


def _streamed(answer: httpx.Response) -> Response:
    """A node's answer streamed back as it comes (a run's output, a file)."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
    return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code, headers=headers,
                             background=_closer(answer))  # fmt: skip


def _closer(answer: httpx.Response) -> Any:
    from starlette.background import BackgroundTask

    return BackgroundTask(answer.aclose)


def _relay_whole(answer: httpx.Response) -> Response:
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
    return Response(answer.content, status_code=answer.status_code, headers=headers)


def _not_routed(request: Request) -> JSONResponse:
    message = (f"{request.method} {request.url.path[:80]} is not served through the fleet yet: talk to a node's "
               "daemon for it (`stasis fleet nodes` lists their addresses)")  # fmt: skip
    return JSONResponse({"type": "Unsupported", "message": message, "details": {}}, status_code=501)
