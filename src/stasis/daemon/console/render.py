"""What every console route shares: the pages (Jinja2, autoescaped: names and paths come from sandboxes),
the login session and its CSRF token, and the rooms and live feed of the daemon it belongs to."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, Request, WebSocket
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from starlette.requests import HTTPConnection

from ..rooms import Rooms, RoomsDep
from .live import Feed
from .sessions import COOKIE, Session

HERE = Path(__file__).parent
pages = Jinja2Templates(directory=HERE / "pages")
__all__ = ["FeedDep", "RoomsDep", "acting", "page", "pages", "refused", "session_of", "to_login"]


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


def page(request: Request, name: str, session: Session, **context: Any) -> HTMLResponse:
    return pages.TemplateResponse(request, name, {"csrf": session.csrf, **context})


def to_login() -> RedirectResponse:
    return RedirectResponse("/ui/login", status_code=303)


def refused() -> JSONResponse:
    return JSONResponse({"error": "log in first (the session is missing, expired or without its CSRF token)"},
                        status_code=401)  # fmt: skip
