"""A team's key at E2B's door: E2B's ``X-API-Key`` may be a stasis team key (:mod:`...rooms.teams`) as well as the
face's own key. A team's key reaches its team's sandboxes only: ``/sandboxes`` and ``/v2/sandboxes`` (create,
list, connect, pause, kill, ...) and its lifecycle events and webhooks (``/events``); another team's sandbox is
"not found" in E2B's own words; templates, volumes,
snapshots and secrets are the owner's (403). A list needs ``read``; anything about one sandbox needs ``exec`` (its
answer carries the sandbox's envd token, which runs commands), and ``write`` too if it changes something."""

from __future__ import annotations

import re
import time

from fastapi import Request
from fastapi.responses import JSONResponse

from ....errors import NotFound, echo
from ...rooms.teams import OWNER, Principal
from ..tenancy import PRINCIPAL
from .plane import error
from .room import E2bRoom

SANDBOX = re.compile(r"^/(?:v2/)?sandboxes/([^/]+)")
TEAM_PATHS = re.compile(r"^/(?:v2/)?sandboxes(?:/|$)|^/events/")


def principal_of_key(room: E2bRoom, key: str | None) -> Principal | None:
    if room.keys.valid_api_key(key):
        return OWNER
    if key and room.teams is not None:
        return room.teams.authenticate(key)
    return None


def refused(room: E2bRoom, request: Request, principal: Principal) -> JSONResponse | None:
    """Why a team's key may not make this request (an E2B error to answer with), or None."""
    request.scope[PRINCIPAL] = principal
    if principal.team is None:
        return None
    path = request.url.path
    if not TEAM_PATHS.match(path):
        return error(403, f"{path[:80]} is the daemon owner's; a team's key reaches its team's sandboxes")
    listing = request.method in ("GET", "HEAD") and (path.rstrip("/") in ("/sandboxes", "/v2/sandboxes")
                                                      or path.startswith("/events/"))  # fmt: skip
    if path.startswith("/events/") and not listing:  # its team's webhooks
        lacking = [] if principal.allows("write") else ["write"]
        return error(403, f"this key of team {principal.team} lacks the write scope") if lacking else None
    # a sandbox's own answer carries its envd token, which runs commands: exec, even to read it
    needed = ("read",) if listing else ("exec",) if request.method in ("GET", "HEAD") else ("write", "exec")
    if lacking := [scope for scope in needed if not principal.allows(scope)]:
        return error(403, f"this key of team {principal.team} lacks the {' and '.join(lacking)} scope it needs here")
    if (match := SANDBOX.match(path)) is not None:
        try:
            team = room.sandbox(match[1]).spec.team
        except NotFound:
            return None  # the route says so, as it would to anyone
        if team != principal.team:
            return error(404, f"sandbox {echo(match[1])} was not found")  # E2B's words, as for a missing one
    return None


def audited(room: E2bRoom, request: Request, principal: Principal | None, status: int, started: float) -> None:
    """Into the daemon's audit log, as its own API's requests are: what may change something, and every refusal."""
    if room.audit is None or (request.method in ("GET", "HEAD") and status < 400):
        return
    client = request.client
    room.audit.record({
        "at": time.time(), "team": principal.team if principal else None,
        "key_id": (principal.key_id or "e2b-key") if principal else "anonymous",
        "client": f"{client.host}:{client.port}" if client else None, "method": request.method,
        "path": "e2b:" + request.url.path[:1020], "status": status, "duration_ms": (time.monotonic() - started) * 1000,
    })  # fmt: skip
