"""The TCP listeners of the E2B face, opened inside the daemon (the rooms live here) for as long as the
`stasis e2b serve` that asked for one stays connected."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass

import uvicorn

from ....e2b_wire import local_domain
from ....errors import InvalidRequest
from ...core.service import SandboxService
from ...rooms.operations import GuestOperations
from ...rooms.ports import Ports
from .room import Defaults, E2bRoom

log = logging.getLogger(__name__)


@dataclass
class Listener:
    host: str
    port: int
    server: uvicorn.Server
    sock: socket.socket
    ticking: asyncio.Task[None]
    domain: str | None = None  # what get_host(port) names: PORT-ID.DOMAIN

    @property
    def exports(self) -> dict[str, str]:
        """What the SDKs need in their environment (the API key is added by who knows it)."""
        return {"E2B_API_URL": self.url, "E2B_SANDBOX_URL": self.url, "E2B_VOLUME_API_URL": self.url}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InvalidRequest(f"listen {listen[:80]!r}: give HOST:PORT, e.g. 127.0.0.1:3000")
    return host.strip("[]") or "127.0.0.1", int(port)


class E2bListeners:
    def __init__(self, room: E2bRoom, core: SandboxService, ops: GuestOperations, ports: Ports) -> None:
        self.room, self.core, self.ops, self.ports = room, core, ops, ports
        self.open_listeners: list[Listener] = []

    async def open(self, listen: str, defaults: Defaults, domain: str | None = None) -> Listener:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise InvalidRequest(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --listen") from None
        sock.listen(128)
        sock.setblocking(False)
        domain = domain or local_domain(host, sock.getsockname()[1])
        from .app import E2bApp  # here: envd's generated code imports all of E2B's SDK (~0.4 s)

        app = E2bApp(self.room, self.core, self.ops, self.ports, defaults, domain)
        config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=5)
        config.load()
        server = uvicorn.Server(config)
        # Not Server.serve(): it takes over the process's signal handlers, which are the daemon's.
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        ticking = asyncio.create_task(server.main_loop())
        listener = Listener(host, sock.getsockname()[1], server, sock, ticking, domain)
        self.open_listeners.append(listener)
        log.info("E2B face listening on %s (backend %s)", listener.url, defaults.backend)
        return listener

    async def close(self, listener: Listener) -> None:
        if listener not in self.open_listeners:
            return
        self.open_listeners.remove(listener)
        listener.server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await listener.ticking
        await listener.server.shutdown(sockets=[listener.sock])
        log.info("E2B face on %s closed", listener.url)

    async def close_all(self) -> None:
        for listener in list(self.open_listeners):
            await self.close(listener)
