"""What every console route shares: the pages (Jinja2, autoescaped: names and paths come from sandboxes),
the login session and its CSRF token, and the rooms and live feed of the daemon it belongs to."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.requests import HTTPConnection

from ....console_sessions import COOKIE, Session
from ....errors import Forbidden
from ....origin import same_origin
from ...rooms.teams import OWNER, Principal
from ..deps import Rooms, RoomsDep
from ..tenancy import check_reach
from .live import Feed

HERE = Path(__file__).parent
pages = Jinja2Templates(directory=HERE / "pages")
__all__ = ["FeedDep", "RoomsDep", "acting", "admitted", "page", "pages", "reach", "refused", "session_of", "to_login",
           "until_ended", "visible"]  # fmt: skip


async def feed_of(connection: HTTPConnection) -> Feed:
    return connection.app.state.feed  # type: ignore[no-any-return]


FeedDep = Annotated[Feed, Depends(feed_of)]


def session_of(connection: Request | WebSocket) -> Session | None:
    """The login, with who it is now: the owner, or the team whose key made it (None once that key is revoked,
    expired or its team removed: its sessions end with it)."""
    rooms: Rooms = connection.app.state.rooms
    session = rooms.logins.get(connection.cookies.get(COOKIE))
    if session is None:
        return None
    session.principal = OWNER if session.key_id is None else rooms.teams.working(session.key_id)
    return session if session.principal is not None else None


async def until_ended(connection: Request | WebSocket, every: float = 2.0) -> None:
    """Return once the connection's session ends (a logout, its expiry, its key revoked): what streams for it (a
    terminal, a desktop, the live list) stops with it."""
    while True:
        await asyncio.sleep(every)
        if session_of(connection) is None:
            return


def visible(session: Session, items: list[Any], team_of: Callable[[Any], str | None]) -> list[Any]:
    """What of ``items`` the session's team sees (the owner: all)."""
    return [item for item in items if session.principal.sees(team_of(item))]


def reach(rooms: Rooms, session: Session, kind: str, ref: str, scope: str = "read") -> None:
    """Raise unless the session may do what needs ``scope`` to the ``kind`` named ``ref``: another team's is not
    found, as on the API (word for word); a scope the key lacks is forbidden."""
    principal: Principal = session.principal
    if principal.team is None:
        return
    if not principal.allows(scope):
        raise Forbidden(f"this key of team {principal.team} lacks the {scope} scope it needs here")
    check_reach(rooms, kind, ref, principal)


def acting(request: Request) -> Session | None:
    """The session of an action: the cookie and the page's CSRF header must both be right."""
    session = session_of(request)
    if session is None or request.headers.get("x-stasis-csrf") != session.csrf:
        return None
    return session


async def admitted(websocket: WebSocket, csrf: str, what: str) -> bool:
    """Accept a console WebSocket, or close it. A WebSocket is not bound by the same-origin policy and the session
    cookie goes to every port of the host (a sandbox's exposed port too): the page must prove it is the console's
    own (its CSRF token, which no other origin can read) and the browser must say it opened it from here."""
    session = session_of(websocket)
    if session is None or not hmac.compare_digest(csrf.encode(), session.csrf.encode()) or not same_origin(websocket):
        await websocket.close(code=4401, reason=f"log in first (the console's own page opens {what})")
        return False
    await websocket.accept()
    return True


def page(request: Request, name: str, session: Session, **context: Any) -> HTMLResponse:
    team = session.principal.team if session.principal is not None else None  # shown on every page
    return pages.TemplateResponse(request, name, {"csrf": session.csrf, "team": team, **context})


def to_login() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


def refused() -> JSONResponse:
    return JSONResponse({"error": "log in first (the session is missing, expired or without its CSRF token)"},
                        status_code=401)  # fmt: skip
