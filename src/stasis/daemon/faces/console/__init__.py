"""The web console: every sandbox at a glance, its checkpoint tree, agent runs step by step, a terminal, the live
view of a desktop.

A room of the daemon, served under ``/ui``: server-rendered pages (Jinja2, everything from a sandbox
escaped), live status over Server-Sent Events, actions as form posts from the page's script, a terminal
(xterm.js, pinned and fetched from the npm registry by ``make setup``) on the daemon's PTY, a desktop through
noVNC (pinned from npm likewise). Login is the daemon's token typed into a form, then a cookie session; the
token never appears in a URL.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from ....errors import StasisError
from ..deps import Rooms
from . import actions, desktop, pages, runs
from .live import Feed
from .render import HERE
from .render import pages as page_templates


def create_console(rooms: Rooms) -> FastAPI:
    """The console as an app to mount at /ui (it makes its own links relative to that)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.state.rooms = rooms
    app.state.feed = Feed(rooms.core, rooms.ports)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    for module in (pages, runs, actions, desktop):
        app.include_router(module.router)

    @app.exception_handler(StasisError)
    async def stasis_error(request: Request, exc: StasisError) -> HTMLResponse:
        """A page about a sandbox that is gone, a file that is not there: said in the page, not a 500."""
        context = {"csrf": "", "message": exc.message}
        return page_templates.TemplateResponse(request, "error.html", context, status_code=exc.status_code)

    return app


__all__ = ["create_console"]
