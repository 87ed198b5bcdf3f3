"""Teams across a fleet: the same teams and keys on every node, a key checked at the door and sent on to the node
that answers, quotas counted over every node, usage summed from every node.

- **Teams and keys are the fleet's.** A team made, changed or removed through the door is so on every live node,
  as a secret is. A key is made by one node, then given as is to every other (``CreateKeyRequest.key``, the
  owner's alone), so it works wherever its team's sandboxes run or move; a revocation reaches every node.
- **A key at the door.** The door asks a node who a key is (``/v1/whoami``, remembered for ``KEY_CACHE_SECS``)
  and lets it through to the routes a key has on a node: sandboxes, checkpoints, usage, its own keys. Every other
  route of the door is the fleet owner's (403). A key's request goes to the node with the key itself, never with
  the fleet's token: the node answers it as it answers the key (its team's alone; another team's is not found).
- **Quotas** are checked by the door over every node before a key's create or resume through the door; each node
  still checks its own part (an automatic resume by a command is checked there only).
- **Usage** is each node's, summed: a sandbox that moved is counted on each node for its time there.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ..errors import (
    CheckpointNotFound,
    DaemonUnavailable,
    Forbidden,
    SandboxNotFound,
    StasisError,
    Unauthorized,
)
from .nodes import Nodes, checked

log = logging.getLogger(__name__)
KEY = re.compile(r"sk_stasis_[0-9a-z]{12}_[0-9a-f]{48}")
KEY_CACHE_SECS = 5.0  # how long the door trusts a node's word on a key (the node checks it again on every call)
KEY_ROUTES = ("/v1/sandboxes", "/v1/checkpoints", "/v1/usage", "/v1/whoami", "/v1/keys", "/v1/health", "/v1/images",
              "/v1/secrets")  # fmt: skip
USAGE_SUMS = ("running_seconds", "suspended_seconds", "cpu_seconds", "cpu_allocated_seconds", "memory_gib_seconds",
              "disk_gib_hours", "egress_bytes", "ingress_bytes", "checkpoint_gib_hours")  # fmt: skip


class Keys:
    """Who a key is, as the nodes say."""

    def __init__(self, nodes: Nodes) -> None:
        self.nodes = nodes
        self._known: dict[str, tuple[float, dict[str, Any] | None]] = {}  # key -> (until, who; None: refused)

    async def who(self, key: str) -> dict[str, Any]:
        """{"team", "scopes", "key_id"} of a key that works now, or Unauthorized. A refusal is remembered as long
        as an acceptance, and a node the door already knows is asked: a stream of made-up keys costs the door and
        its nodes one small request each, never a look at the whole fleet."""
        now = time.monotonic()
        if (known := self._known.get(key)) is not None and known[0] > now:
            if known[1] is None:
                raise _refused()
            return known[1]
        up = [n for n in self.nodes.known().values() if n.get("state") == "up"] or await self.nodes.live()
        if not up:
            raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
        try:
            answer = await self.nodes.client(up[0]).get("/v1/whoami", headers=bearer(key))
            who = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            raise DaemonUnavailable(f"node {up[0]['name']} did not say who the key is: {exc}") from exc
        if len(self._known) > 10_000:
            self._known = {k: v for k, v in self._known.items() if v[0] > now}
            if len(self._known) > 10_000:
                self._known.clear()
        self._known[key] = (now + KEY_CACHE_SECS, who if who and who.get("team") is not None else None)
        if self._known[key][1] is None:
            raise _refused()
        return who  # type: ignore[return-value]


def _refused() -> Unauthorized:
    return Unauthorized("missing, wrong, expired or revoked API token or key; send 'Authorization: Bearer "
                        "$STASIS_TOKEN'")  # fmt: skip


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def key_of(request: Request) -> str | None:
    """The team key a request came with (None: the fleet owner's token)."""
    return getattr(request.state, "key", None)


def as_caller(request: Request) -> dict[str, str]:
    """The headers that make a node answer as the caller: the key's, or none (the node client's own token)."""
    key = key_of(request)
    return bearer(key) if key else {}


def key_may(method: str, path: str) -> bool:
    """Whether a door route is one a key has on a node (the rest of the door is the owner's)."""
    if path.startswith(("/v1/health", "/v1/images")) and method != "GET":
        return False
    return any(path == p or path.startswith(p + "/") for p in KEY_ROUTES)


async def welcome(nodes: Nodes, node: dict[str, Any], reference: dict[str, Any]) -> None:
    """A node that joined gets the teams and keys (hashes only) the fleet's other nodes have, revocations too."""
    new, old = nodes.client(node), nodes.client(reference)
    theirs = {t["name"]: t for t in _ok(await new.get("/v1/teams")).json()}
    for team in _ok(await old.get("/v1/teams")).json():
        if team["name"] not in theirs:
            _ok(await new.post("/v1/teams", json={"name": team["name"], "quotas": team["quotas"]}))
        elif theirs[team["name"]]["quotas"] != team["quotas"]:
            _ok(await new.patch(f"/v1/teams/{checked(team['name'])}", json=team["quotas"]))
    _ok(await new.post("/v1/keys/import", json=_ok(await old.get("/v1/keys/export")).json()))
    log.info("node %s has the fleet's teams and keys", node["name"])


def _ok(answer: Any) -> Any:
    if not answer.is_success:
        asked = f"{answer.request.method} {answer.request.url.path}"
        raise StasisError(f"{asked}: {answer.status_code} {answer.text[:200]}")
    return answer


def team_routes(app: FastAPI, nodes: Nodes) -> None:
    """Teams and keys on every node; usage summed from every node."""
    changing = asyncio.Lock()  # one change at a time reaches every node, so all apply them in one order

    @app.api_route("/v1/teams", methods=["POST"])
    @app.api_route("/v1/teams/{name}", methods=["PATCH", "DELETE"])
    async def change_team(request: Request, name: str | None = None) -> Response:
        path = "/v1/teams" + (f"/{checked(name)}" if name else "")
        async with changing:
            return await everywhere(nodes, request.method, path, await request.body(), {})

    @app.delete("/v1/keys/{key_id}")
    async def revoke_key(request: Request, key_id: str) -> Response:
        async with changing:
            return await everywhere(nodes, "DELETE", f"/v1/keys/{checked(key_id)}", b"", as_caller(request))

    @app.post("/v1/keys")
    async def create_key(request: Request) -> Response:
        """Made by one node (as the caller: an admin key makes its own team's), then given to every other."""
        body = await request.json()
        async with changing:
            live = await _live(nodes)
            made = await nodes.client(live[0]).post("/v1/keys", json=body, headers=as_caller(request))
            if made.status_code != 201:
                return _whole(made)
            key = made.json()
            given = {**body, "team": key["team"], "scopes": key["scopes"], "key": key["key"]}
            if key.get("made_by"):  # its lineage on every node, so that revoking its maker reaches it everywhere
                given["made_by"] = key["made_by"]
            if key.get("expires_at"):
                given["expires_in_secs"] = max(1, round(key["expires_at"] - time.time()))
            answers = await asyncio.gather(*(nodes.client(n).post("/v1/keys", json=given) for n in live[1:]))
            if failed := [n["name"] for n, a in zip(live[1:], answers, strict=True) if a.status_code != 201]:
                await everywhere(nodes, "DELETE", f"/v1/keys/{key['id']}", b"", {})  # none half made
                raise StasisError(f"the key could not be given to node(s) {', '.join(failed)}; it was revoked "
                                  "everywhere: make it again")  # fmt: skip
            return JSONResponse(key, status_code=201)

    @app.get("/v1/teams")
    @app.get("/v1/teams/{name}")
    @app.get("/v1/keys")
    @app.get("/v1/whoami")
    async def read_one(request: Request, name: str | None = None) -> Response:
        path = request.url.path if name is None else f"/v1/teams/{checked(name)}"
        answer = await nodes.client((await _live(nodes))[0]).get(path, params=request.query_params,
                                                                 headers=as_caller(request))  # fmt: skip
        return _whole(answer)

    @app.get("/v1/usage")
    async def usage(request: Request) -> Response:
        live = await _live(nodes)
        answers = await asyncio.gather(*(nodes.client(n).get("/v1/usage", params=request.query_params,
                                                             headers=as_caller(request)) for n in live))  # fmt: skip
        for answer in answers:
            if not answer.is_success:
                return _whole(answer)
        return JSONResponse(merge_usage([a.json() for a in answers]))


def merge_usage(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes' usage reports as one: a sandbox's or team's sums added up over the nodes."""
    sandboxes: dict[str, dict[str, Any]] = {}
    teams: dict[str | None, dict[str, Any]] = {}
    for report in reports:
        for row in report["sandboxes"]:
            _add(sandboxes.setdefault(row["sandbox_id"], {**row, **dict.fromkeys(USAGE_SUMS, 0)}), row)
        for row in report["teams"]:
            total = teams.setdefault(row["team"], {**row, **dict.fromkeys(USAGE_SUMS, 0), "sandboxes": 0})
            _add(total, row)
    for total in teams.values():  # a sandbox that moved is one sandbox
        total["sandboxes"] = sum(1 for s in sandboxes.values() if s["team"] == total["team"])
    return {
        "since": min((r["since"] for r in reports), default=0.0),
        "until": max((r["until"] for r in reports), default=0.0),
        "teams": sorted(teams.values(), key=lambda t: t["team"] or ""),
        "sandboxes": list(sandboxes.values()),
    }


def _add(total: dict[str, Any], row: dict[str, Any]) -> None:
    for field in USAGE_SUMS:
        total[field] = total.get(field, 0) + row.get(field, 0)


async def everywhere(nodes: Nodes, method: str, path: str, body: bytes, headers: dict[str, str]) -> Response:
    """One change on every live node; where some took it and some not, say which, never half silently."""
    live = await _live(nodes)
    sent = {"content-type": "application/json", **headers}
    answers = await asyncio.gather(*(nodes.client(n).request(method, path, content=body, headers=sent) for n in live),
                                   return_exceptions=True)  # fmt: skip
    failed = [(n["name"], a) for n, a in zip(live, answers, strict=True)
              if isinstance(a, BaseException) or not a.is_success]  # fmt: skip
    if failed and len(failed) < len(live):
        first = failed[0][1]
        why = str(first) if isinstance(first, BaseException) else first.text
        raise StasisError(f"{method} {path} failed on node(s) {', '.join(n for n, _ in failed)}: {why[:200]}; "
                          "run it again")  # fmt: skip
    if isinstance(answers[0], BaseException):
        raise DaemonUnavailable(f"no node took {method} {path}: {answers[0]}")
    return _whole(answers[0])


async def _live(nodes: Nodes) -> list[dict[str, Any]]:
    live = await nodes.live()
    if not live:
        raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
    return live


def _whole(answer: Any) -> Response:
    kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type",)}
    return Response(answer.content, status_code=answer.status_code, headers=kept)


def refuse_key(path: str) -> Forbidden:
    return Forbidden(f"{path[:80]} is the fleet owner's; a team's key reaches its sandboxes, checkpoints, secrets, "
                     "usage and keys")  # fmt: skip


def require(request: Request, scope: str) -> None:
    """A key's scope for what the door does itself on its behalf (a move): as a node would check it."""
    if key_of(request) is None:
        return
    scopes = request.state.scopes
    if not ("admin" in scopes or scope in scopes):
        raise Forbidden(f"this key of team {request.state.team} lacks the {scope} scope it needs here "
                        f"(it has {', '.join(sorted(scopes))})")  # fmt: skip


def not_found(kind: str, ref: str) -> StasisError:
    """What a node says to a key of a name nobody has, word for word: the door says the same, so a key never learns
    that another team's sandbox exists somewhere in the fleet."""
    if kind == "sandboxes":
        shown = ref if len(ref) <= 80 else ref[:80] + "..."
        return SandboxNotFound(f"no sandbox named or with id {shown!r}; `stasis ls` lists them", ref=shown)
    return CheckpointNotFound(f"no checkpoint named or with id {ref[:80]!r}; `stasis checkpoints` lists them")
