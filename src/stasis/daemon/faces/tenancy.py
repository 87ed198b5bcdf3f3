"""Who is asking, and may they: every HTTP request and WebSocket of the daemon passes here first.

- Over the unix socket (mode 0600: the owner's) the asker is the owner, as is a TCP client sending the owner's
  token. Any other TCP client sends a team's key (:mod:`..rooms.teams`) or is refused (401). A team's key sent
  over the unix socket acts as its team there too: the owner may always act as less (MCP over HTTP does, for
  the key that called it).
- A team's key reaches its team's sandboxes, checkpoints, volumes, secrets and keys, and reads the image list;
  every other route is the owner's (403). Reading needs ``read``; running commands, files, terminals and ports
  in a sandbox need ``exec``; anything else that changes something needs ``write``.
- A sandbox, checkpoint, volume or volume snapshot of another team is not found (404), never forbidden: a key
  learns nothing of what other teams have. Lists are filtered by the routes (:func:`principal_of`).

The console (``/ui``) keeps its own login: the owner's token, or a team's key (:mod:`.console`).
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from fastapi import Depends
from starlette.requests import HTTPConnection

from ... import tracing
from ...errors import (
    CheckpointNotFound,
    Forbidden,
    InvalidRequest,
    NotFound,
    SandboxNotFound,
    StasisError,
    Unauthorized,
    VolumeNotFound,
    echo,
)
from ..rooms.audit import AuditLog
from ..rooms.teams import KEY, OWNER, Principal

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
App = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

PRINCIPAL = "stasis.principal"
TEAM_ROUTES = ("/v1/sandboxes", "/v1/checkpoints", "/v1/volumes", "/v1/volume-snapshots", "/v1/keys",
               "/v1/whoami", "/v1/usage", "/v1/secrets")  # fmt: skip
TEAM_READS = ("/v1/images", "/v1/health")  # read only
MCP = "/mcp"  # any key: each tool's call to the daemon is checked as the caller's (:mod:`.mcp_http`)
EXEC = re.compile(r"^/v1/sandboxes/[^/]+/(exec|processes|files|dirs|pty|ssh|code|desktop|ports)(/|$)")
OWNED = (
    (re.compile(r"^/v1/sandboxes/([^/]+)"), "sandbox"),
    (re.compile(r"^/v1/checkpoints/([^/]+)"), "checkpoint"),
    (re.compile(r"^/v1/volumes/([^/]+)"), "volume"),
    (re.compile(r"^/v1/volume-snapshots/([^/]+)"), "snapshot"),
)
NOT_OWNED = {("POST", "/v1/sandboxes/remove")}  # a verb on many, filtered by its route


class Tenancy:
    def __init__(self, app: App, token: str | None) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:  # fmt: skip
        if scope["type"] not in ("http", "websocket") or _console(scope["path"]):
            return await self.app(scope, receive, send)
        started, answered = time.monotonic(), {"status": 101 if scope["type"] == "websocket" else 500}
        audit = scope["app"].state.rooms.audit  # now: a mounted app (/mcp) puts itself in scope["app"] on its way
        principal = None
        try:
            principal = self.principal(scope)
            if principal.team is not None:
                self.check(scope, principal)
        except StasisError as exc:
            answered["status"] = exc.status_code
            await _refuse(scope, receive, send, exc)
            return self._audit(audit, scope, principal, answered["status"], started)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                answered["status"] = message["status"]
            await send(message)

        scope[PRINCIPAL] = principal
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        try:
            with tracing.incoming(headers):  # a traceparent sent makes this request's spans the caller's
                await self.app(scope, receive, sending)
        finally:
            self._audit(audit, scope, principal, answered["status"], started)

    @staticmethod
    def _audit(audit: AuditLog, scope: Scope, principal: Principal | None, status: int, started: float) -> None:
        """Every request that may change something, and every refused one (reads that succeed are not)."""
        method = scope.get("method", "WEBSOCKET")
        if method in ("GET", "HEAD") and status < 400:
            return
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client and client[0] else "unix socket"
        audit.record({
            "at": time.time(), "team": principal.team if principal else None,
            "key_id": principal.key_id if principal else "anonymous", "client": where, "method": method,
            "path": scope["path"][:1024], "status": status, "duration_ms": (time.monotonic() - started) * 1000,
        })  # fmt: skip

    def principal(self, scope: Scope) -> Principal:
        server = scope.get("server")
        sent = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if self.token is not None and hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
            return OWNER
        if sent.startswith("Bearer ") and (found := scope["app"].state.rooms.teams.authenticate(sent[7:])):
            return found  # type: ignore[no-any-return]
        local = self.token is None or (server is not None and server[1] is None)
        if local and not KEY.fullmatch(sent.removeprefix("Bearer ")):
            # The unix socket (mode 0600) is the owner's; a team's key sent there acts as its team, and one that
            # no longer works is refused, never taken for the owner (MCP over HTTP sends its caller's key here).
            return OWNER
        raise Unauthorized("missing, wrong, expired or revoked API token or key; send 'Authorization: Bearer "
                            "$STASIS_TOKEN'")  # fmt: skip

    def check(self, scope: Scope, principal: Principal) -> None:
        path, method = scope["path"], scope.get("method", "GET")
        reading = scope["type"] == "http" and method in ("GET", "HEAD")
        if path == MCP:
            return
        if not (_under(path, TEAM_ROUTES) or (reading and _under(path, TEAM_READS))):
            raise Forbidden(f"{path[:80]} is the daemon owner's; a team's key reaches its sandboxes, checkpoints, "
                            "volumes and keys")  # fmt: skip
        needed = "exec" if scope["type"] == "websocket" or EXEC.match(path) else "read" if reading else "write"
        if not path.startswith("/v1/keys") and not principal.allows(needed):
            raise Forbidden(f"this key of team {principal.team} lacks the {needed} scope it needs here "
                            f"(it has {', '.join(sorted(principal.scopes))})")  # fmt: skip
        if (method, path) not in NOT_OWNED:
            _check_owner(scope["app"].state.rooms, path, principal)


def _check_owner(rooms: Any, path: str, principal: Principal) -> None:
    """The resource ``path`` names, if another team's, is not found: the very answer a name nobody has gets (for a
    key, a sandbox that moved to the store is not found either: keys never pull from it)."""
    for pattern, kind in OWNED:
        if (match := pattern.match(path)) is None:
            continue
        return check_reach(rooms, kind, match[1], principal)


def check_reach(rooms: Any, kind: str, ref: str, principal: Principal) -> None:
    """``ref``, a ``kind`` (sandbox, checkpoint, volume, snapshot), if another team's, is not found."""
    try:
        team = _team_of(rooms, kind, ref)
    except NotFound:
        raise missing(kind, ref) from None
    if not principal.sees(team):
        raise missing(kind, ref)


def missing(kind: str, ref: str) -> NotFound:
    """What the rooms say of a name nobody has, word for word."""
    shown = ref if len(ref) <= 80 else ref[:80] + "..."
    if kind == "sandbox":
        return SandboxNotFound(f"no sandbox named or with id {shown!r}; `stasis ls` lists them", ref=shown)
    if kind == "checkpoint":
        return CheckpointNotFound(f"no checkpoint named or with id {ref[:80]!r}; `stasis checkpoints` lists them")
    if kind == "volume":
        return VolumeNotFound(f"no volume named {echo(ref)}; `stasis volume ls` lists them")
    return VolumeNotFound(f"no volume snapshot {echo(ref)}; `stasis volume snapshots` lists them")


def _team_of(rooms: Any, kind: str, ref: str) -> str | None:
    if kind == "sandbox":
        return rooms.core.lookup(ref).spec.team  # type: ignore[no-any-return]
    if kind == "checkpoint":
        return rooms.checkpoints.get(ref).spec.team  # type: ignore[no-any-return]
    if kind == "volume":
        try:
            return rooms.volumes.store.get(ref).team  # type: ignore[no-any-return]
        except InvalidRequest:
            raise NotFound(ref) from None
    return rooms.volumes.store.snapshot(ref).team  # type: ignore[no-any-return]


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def _console(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


async def _refuse(scope: Scope, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]],
                  exc: StasisError) -> None:  # fmt: skip
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        if isinstance(exc, NotFound):  # as the route answers a name nobody has: accepted, then closed
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": 4400, "reason": exc.message[:120]})
            return
        await send({"type": "websocket.close", "code": 4000 + exc.status_code, "reason": exc.message[:120]})
        return
    body = json.dumps(exc.to_payload()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": exc.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})  # fmt: skip


async def principal_of(connection: HTTPConnection) -> Principal:
    return connection.scope.get(PRINCIPAL, OWNER)  # type: ignore[no-any-return]


PrincipalDep = Annotated[Principal, Depends(principal_of)]
