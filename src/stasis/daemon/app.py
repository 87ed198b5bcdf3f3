"""The daemon's app: the rooms wired together (:mod:`.rooms`), their start and stop, and the faces mounted
on them: the HTTP routers (:mod:`.routes`), the console (:mod:`.console`) and MCP."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI

from .. import __version__, tracing
from ..body_limits import BodyLimit
from ..e2b_models import E2bServeRequest
from ..paths import Paths
from .core.recovery import Recovery
from .core.service import SandboxService
from .faces import mcp_http
from .faces.accepts import quiet_accept_failures
from .faces.console import create_console
from .faces.e2b.resident import serve_e2b
from .faces.guards import map_errors
from .faces.routes import ROUTERS
from .faces.tenancy import Tenancy
from .wiring import build

log = logging.getLogger(__name__)


def create_app(
    paths: Paths,
    token: str | None = None,
    on_shutdown: Callable[[], None] | None = None,
    service: SandboxService | None = None,
    e2b: E2bServeRequest | None = None,
) -> FastAPI:
    """The daemon's app; ``service`` may be given (one with a test's fake backend, or its own clock); ``e2b``
    opens E2B's face for as long as the daemon runs (`stasis serve --e2b`)."""
    rooms = build(paths, service or SandboxService(paths), token)
    mcp_app: mcp_http.LazyMcpApp | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        quiet_accept_failures(asyncio.get_running_loop())
        tracing.setup()
        await rooms.core.start()
        await rooms.ports.start()
        await Recovery(rooms.core, rooms.settling).run()
        await rooms.pools.start()
        rooms.reaper.start()
        rooms.webhooks.start()
        rooms.meter.start()
        await rooms.e2b.sweep()
        if e2b is not None:
            await serve_e2b(rooms, paths, e2b)
        yield
        await rooms.e2b_listeners.close_all()
        if mcp_app is not None:
            await mcp_app.aclose()
        await rooms.reaper.stop()
        await rooms.webhooks.stop()
        await rooms.meter.stop()
        rooms.audit.close()
        tracing.shutdown()
        await rooms.pools.close()
        await rooms.ports.close()
        await rooms.core.close()
        if on_shutdown is not None:  # uvicorn re-raises SIGTERM after this: code after run() may never run
            on_shutdown()

    app = FastAPI(title="stasis", version=__version__, lifespan=lifespan)
    app.add_middleware(BodyLimit)
    app.state.rooms = rooms
    mcp_app = mcp_http.mount(app, paths)
    app.mount("/ui", create_console(rooms))
    app.add_middleware(Tenancy, token=token)
    map_errors(app, paths)
    for router in ROUTERS:
        app.include_router(router)
    return app
