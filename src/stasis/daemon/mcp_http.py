"""The MCP server over streamable HTTP, served by the daemon at ``/mcp`` when ``stasis[mcp]`` is installed.

It sits behind the daemon's guard like every route: the unix socket's mode 0600, the token over TCP.
Its tools reach the sandboxes through the daemon's own socket, as the stdio server does from outside.
"""

from __future__ import annotations

import logging
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI

from ..paths import Paths
from ..sdk import AsyncClient

log = logging.getLogger(__name__)

PATH = "/mcp"


def mount(app: FastAPI, paths: Paths) -> AbstractAsyncContextManager[None] | None:
    """Add the MCP route to ``app``; the returned context (entered for the daemon's life) runs its
    sessions. None when the ``mcp`` package is not installed."""
    try:
        from ..integrations import mcp
    except ImportError:
        log.info("MCP over HTTP is off: pip install 'stasis[mcp]' to serve it at %s", PATH)
        return None

    def own_socket() -> AsyncClient:
        client = AsyncClient(paths)
        client.autostart = False  # this daemon answers; never start another
        return client

    server = mcp.build_server(own_socket)
    app.router.routes.extend(mcp.http_app(server, PATH).routes)
    return server.session_manager.run()
