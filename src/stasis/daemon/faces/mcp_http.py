"""The MCP server over streamable HTTP, served by the daemon at ``/mcp`` when ``stasis[mcp]`` is installed.

It sits behind the daemon's guard like every route: the unix socket's mode 0600, the token over TCP.
Its tools reach the sandboxes through the daemon's own socket, as the stdio server does from outside.
The ``mcp`` package (about a second to import) loads on the first request, not at the daemon's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ...paths import Paths
from ...sdk import AsyncClient

log = logging.getLogger(__name__)

PATH = "/mcp"


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
        await self._app(scope, receive, send)

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
        client = AsyncClient(self.paths)
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
