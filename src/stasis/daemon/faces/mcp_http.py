"""The MCP server over streamable HTTP, served by the daemon at ``/mcp`` when ``stasis[mcp]`` is installed.

It sits behind the daemon's guard like every route: the unix socket's mode 0600, the token or a team's key over
TCP. Its tools reach the sandboxes through the daemon's own socket, as the stdio server does from outside, and
as whoever called: a tool called with a team's key sends that key along, so the daemon answers it exactly as it
answers the key (its team's sandboxes alone, its scopes). The MCP library runs each call in the context of the
HTTP request that carried it, so the key is the one of that very request, whatever session it names.
The ``mcp`` package (about a second to import) loads on the first request, not at the daemon's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from contextvars import ContextVar
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ...paths import Paths
from ...sdk import AsyncClient
from .tenancy import PRINCIPAL

log = logging.getLogger(__name__)

PATH = "/mcp"
CALLER_KEY: ContextVar[str | None] = ContextVar("stasis_mcp_caller_key", default=None)  # a team's, else None


class LazyMcpApp:
    """An ASGI app that builds the MCP server when first asked, and runs its sessions until ``aclose``."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self._app: Any = None
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            async with self._lock:
                if self._app is None:
                    self._app = await self._start()
        principal = scope.get(PRINCIPAL)
        key = None
        if principal is not None and principal.team is not None:
            key = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1").removeprefix("Bearer ")
        reset = CALLER_KEY.set(key)
        try:
            await self._app(scope, receive, send)
        finally:
            CALLER_KEY.reset(reset)

    async def _start(self) -> Any:
        from ...integrations import mcp

        server = mcp.build_server(self._own_socket)
        app = mcp.http_app(server, PATH)  # also makes the server's session manager
        ready = asyncio.Event()

        async def run_sessions() -> None:
            # Entered and left in this one task, as its anyio task group requires.
            async with server.session_manager.run():
                ready.set()
                await self._stop.wait()

        self._runner = asyncio.create_task(run_sessions(), name="mcp-sessions")
        await ready.wait()
        log.info("serving MCP over streamable HTTP at %s", PATH)
        return app

    def _own_socket(self) -> AsyncClient:
        client = AsyncClient(self.paths, token=CALLER_KEY.get())  # None: the owner's, as the stdio server
        client.autostart = False  # this daemon answers; never start another
        return client

    async def aclose(self) -> None:
        self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner


def mount(app: FastAPI, paths: Paths) -> LazyMcpApp | None:
    """Add the MCP route to ``app``; ``aclose`` the result at shutdown. None without the ``mcp`` package."""
    if importlib.util.find_spec("mcp") is None:
        log.info("MCP over HTTP is off: pip install 'stasis[mcp]' to serve it at %s", PATH)
        return None
    lazy = LazyMcpApp(paths)
    app.router.add_route(PATH, lazy, include_in_schema=False)
    return lazy
