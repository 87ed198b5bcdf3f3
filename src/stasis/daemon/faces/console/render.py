"""What every console route shares: the pages (Jinja2, autoescaped: names and paths come from sandboxes),
the login session and its CSRF token, and the rooms and live feed of the daemon it belongs to."""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.requests import HTTPConnection

from ....console_sessions import COOKIE, Session
from ....origin import same_origin
from ..deps import Rooms, RoomsDep
from .live import Feed

HERE = Path(__file__).parent
pages = Jinja2Templates(directory=HERE / "pages")
__all__ = ["FeedDep", "RoomsDep", "acting", "admitted", "page", "pages", "refused", "session_of", "to_login"]


async def feed_of(connection: HTTPConnection) -> Feed:
    return connection.app.state.feed  # type: ignore[no-any-return]


FeedDep = Annotated[Feed, Depends(feed_of)]


def session_of(connection: Request | WebSocket) -> Session | None:
    rooms: Rooms = connection.app.state.rooms
    return rooms.logins.get(connection.cookies.get(COOKIE))


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
    return pages.TemplateResponse(request, name, {"csrf": session.csrf, **context})


def to_login() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


def refused() -> JSONResponse:
    return JSONResponse({"error": "log in first (the session is missing, expired or without its CSRF token)"},
                        status_code=401)  # fmt: skip
