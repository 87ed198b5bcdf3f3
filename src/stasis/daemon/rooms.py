"""The daemon's rooms, wired together in one place: the lifecycle core, and what stands on it.

    faces       routes/ (HTTP), console/, mcp_http, e2b/    translate a protocol onto the rooms below
    code        CodeRoom: run_code, relayed to the kernel server in the sandbox (E2B's SDKs reach it directly)
    desktop     DesktopRoom: a desktop session's screen, mouse, keyboard and browser
    front       Front: create and resume get their source   pools, templates, the remote store
    features    Checkpoints, forks, PoolManager, Ports, RemoteService, GuestOperations, ssh, idle reaper,
                SecretsRoom (the secret store, its CAs, the broker the egress proxy asks)
    core        SandboxService: locks, store transitions, channels, backends, one teardown

Each room is handed only what it uses; none reaches back into a room above it. A face gets the rooms
through :func:`rooms_of` (FastAPI's dependency), never through a module-level global.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from ..paths import Paths
from ..remote.config import RemoteConfig
from .checkpointing import Checkpoints
from .code import CodeRoom
from .console.sessions import Sessions
from .desktop import DesktopRoom
from .e2b.keys import E2bKeys
from .e2b.listener import E2bListeners
from .e2b.room import E2bRoom
from .front import Front
from .idle import IdleReaper
from .operations import GuestOperations
from .pools import PoolManager
from .ports import Ports
from .remote import RemoteService
from .secrets import SecretsRoom
from .service import SandboxService
from .ssh import HostKeys


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
    token: str | None = None  # the API's, over TCP
    logins: Sessions = field(default_factory=Sessions)  # the console's: a token typed once, then a cookie

    @classmethod
    def build(cls, paths: Paths, core: SandboxService, token: str | None = None) -> Rooms:
        checkpoints = Checkpoints(core)
        remote_config = RemoteConfig.from_env()
        remote = RemoteService(core, remote_config) if remote_config else None
        pools = PoolManager(core)
        ports = Ports(core)
        core.teardown_hooks.append(ports.forget)  # an exposed port's listener goes with its sandbox
        secrets = SecretsRoom(core)
        front, ops = Front(core, pools, remote, secrets.check), GuestOperations(core)
        e2b = E2bRoom(core, front, checkpoints, E2bKeys(paths.home, token), secrets)
        rooms = cls(
            paths=paths, core=core, front=front, checkpoints=checkpoints, pools=pools, ports=ports, remote=remote,
            ops=ops, host_keys=HostKeys(paths.home / "ssh-host-keys"), reaper=IdleReaper(core, checkpoints),
            e2b=e2b, e2b_listeners=E2bListeners(e2b, core, ops, ports), code=CodeRoom(core, ports, ops),
            desktop=DesktopRoom(core, ports, ops), secrets=secrets, token=token,
        )  # fmt: skip
        e2b.code_interpreter = rooms.code.ensure
        if token:
            rooms.logins.tokens.add(token)
        return rooms


async def rooms_of(connection: HTTPConnection) -> Rooms:
    """Async, as every dependency here: FastAPI runs a plain function in a worker thread, a hop per request."""
    return connection.app.state.rooms  # type: ignore[no-any-return]


RoomsDep = Annotated[Rooms, Depends(rooms_of)]
