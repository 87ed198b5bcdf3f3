"""The rooms as the faces see them: one container (:class:`Rooms`), handed to every route, page and socket
through FastAPI's dependency (:data:`RoomsDep`), never through a module-level global. It is built in one place,
:func:`stasis.daemon.wiring.build`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from ...console_sessions import Sessions
from ...paths import Paths
from ..core.service import SandboxService
from ..rooms.audit import AuditLog
from ..rooms.checkpointing import Checkpoints
from ..rooms.code import CodeRoom
from ..rooms.desktop import DesktopRoom
from ..rooms.front import Front
from ..rooms.idle import IdleReaper
from ..rooms.meter import Meter
from ..rooms.operations import GuestOperations
from ..rooms.pools import PoolManager
from ..rooms.ports import Ports
from ..rooms.remote import RemoteService
from ..rooms.secrets import SecretsRoom
from ..rooms.ssh import HostKeys
from ..rooms.teams import TeamsRoom
from ..rooms.volumes import VolumesRoom
from ..rooms.webhooks import WebhooksRoom
from .e2b.listener import E2bListeners
from .e2b.room import E2bRoom


@dataclass
class Rooms:
    paths: Paths
    core: SandboxService
    front: Front
    checkpoints: Checkpoints
    pools: PoolManager
    ports: Ports
    remote: RemoteService | None
    ops: GuestOperations
    host_keys: HostKeys
    reaper: IdleReaper
    e2b: E2bRoom
    e2b_listeners: E2bListeners
    code: CodeRoom
    desktop: DesktopRoom
    secrets: SecretsRoom
    volumes: VolumesRoom
    teams: TeamsRoom
    webhooks: WebhooksRoom
    audit: AuditLog
    meter: Meter
    token: str | None = None  # the API's, over TCP
    logins: Sessions = field(default_factory=Sessions)  # the console's: a token typed once, then a cookie
    settling: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # before recovery, after a restart


async def rooms_of(connection: HTTPConnection) -> Rooms:
    """Async, as every dependency here: FastAPI runs a plain function in a worker thread, a hop per request."""
    return connection.app.state.rooms  # type: ignore[no-any-return]


RoomsDep = Annotated[Rooms, Depends(rooms_of)]
