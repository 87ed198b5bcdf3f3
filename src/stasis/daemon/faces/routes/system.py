"""The daemon itself: health, metrics, disk usage, console login tokens for `stasis ui`."""

from __future__ import annotations

import asyncio
import os

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from .... import __version__
from ....models import DaemonInfo, DiskUsage
from ...rooms.usage import disk_usage
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.get("/v1/health")
async def health(rooms: RoomsDep, principal: PrincipalDep) -> DaemonInfo:
    """The daemon's version and backends; its pid, home and the backends' host details for the owner alone (a
    team's key is a tenant: which runsc build, kernel or directory the host runs is not its business)."""
    backends = rooms.core.describe_backends()
    if principal.team is not None:
        return DaemonInfo(version=__version__, pid=0, home="", backends={name: {} for name in backends})
    return DaemonInfo(version=__version__, pid=os.getpid(), home=str(rooms.paths.home), backends=backends)


@router.get("/metrics", include_in_schema=False)
async def metrics(rooms: RoomsDep) -> Response:
    body = rooms.core.metrics.render(rooms.core.list(include_terminated=True))
    return Response(body, media_type="text/plain; version=0.0.4")


@router.get("/v1/df")
async def df(rooms: RoomsDep) -> DiskUsage:
    return await asyncio.to_thread(disk_usage, rooms.core, rooms.checkpoints, rooms.remote)


@router.get("/ui", include_in_schema=False)
async def console_root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.post("/v1/console/tokens", include_in_schema=False)
async def console_token(rooms: RoomsDep) -> dict[str, str]:
    """A new console login token (for `stasis ui`): signed, good for 12 hours (and, on a daemon without a TCP
    token, while it runs)."""
    return {"token": rooms.logins.login_token()}
