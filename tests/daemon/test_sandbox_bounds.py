"""What a sandbox's servers say is held by the daemon only up to a bound: a WebSocket message through the E2B
port proxy, an answer of the code interpreter's server read whole. Hostile servers on the host's loopback stand
in for them, reached through the real agent on the fake backend (a sandbox without network)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from websockets.server import ServerProtocol

from stasis.daemon.core.service import SandboxService
from stasis.daemon.faces.e2b.port_websocket import MESSAGE_LIMIT, proxy_websocket
from stasis.daemon.rooms.code import ANSWER_LIMIT, CodeRoom
from stasis.daemon.rooms.operations import GuestOperations
from stasis.daemon.rooms.ports import Ports
from stasis.errors import GuestError
from tests.fastkit import create, fake_home, running_service

pytestmark = pytest.mark.fast


def run(scenario: Callable[[SandboxService], Awaitable[None]]) -> None:
    async def main() -> None:
        async with running_service(fake_home("bounds")) as service:
            await scenario(service)

    asyncio.run(main())


@contextlib.contextmanager
def endless_websocket() -> Iterator[int]:
    """A WebSocket server that speaks at once: its handshake's answer, a whole message and the first fragment of
    one that never ends leave in one write; fragments follow for as long as the connection lasts."""
    server = socket.create_server(("127.0.0.1", 0))

    def flood() -> None:
        connection, _ = server.accept()
        with connection, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            protocol = ServerProtocol(max_size=None)
            protocol.receive_data(request)
            protocol.send_response(protocol.accept(protocol.events_received()[0]))  # type: ignore[arg-type]
            protocol.send_binary(b"a whole message first")
            protocol.send_binary(b"x" * 65536, fin=False)
            while True:
                connection.sendall(b"".join(protocol.data_to_send()))
                protocol.send_continuation(b"x" * 65536, fin=False)

    threading.Thread(target=flood, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_a_websocket_message_that_never_ends_closes_with_1009() -> None:
    """The proxy kept every fragment of a message that never ends (158 -> 459 MB in 4 s, not given back). And
    what a server says with its handshake's answer is relayed, not dropped."""

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "ws-flood")
        sent: list[dict[str, Any]] = []
        left = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not sent:
                return {"type": "websocket.connect"}
            await left.wait()  # the client says nothing more
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "websocket", "path": "/", "raw_path": b"/", "query_string": b"", "headers": []}
        with endless_websocket() as port:
            await asyncio.wait_for(
                proxy_websocket(Ports(service, service.tables.ports), info.id, port, scope, receive, send), 120
            )
        assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.close"]
        assert sent[1]["bytes"] == b"a whole message first"
        assert sent[2]["code"] == 1009 and "message too big" in sent[2]["reason"]
        assert f"{MESSAGE_LIMIT >> 20} MiB" in sent[2]["reason"]

    run(scenario)


@contextlib.contextmanager
def endless_answers() -> Iterator[int]:
    """A "kernel server" whose every answer never ends: a 200 for GET, a 500 for anything else."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer(connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            request = connection.recv(65536)
            status = "200 OK" if request.startswith(b"GET") else "500 Internal Server Error"
            connection.sendall(f"HTTP/1.0 {status}\r\ncontent-type: application/json\r\n\r\n".encode())
            while True:
                connection.sendall(b'["' + b"x" * 65536)

    def serve_forever() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(connection,), daemon=True).start()

    threading.Thread(target=serve_forever, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def test_an_answer_of_the_code_interpreter_read_whole_is_bounded() -> None:
    """Answers the daemon reads whole (a context listing, an error's text) were joined without a bound."""

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "kernel-flood")
        ports = Ports(service, service.tables.ports)
        room = CodeRoom(service, ports, GuestOperations(service))
        with endless_answers() as port:
            room.server.port = port  # the kernel server's port: this hostile one answers there
            for method, path in (("GET", "/contexts"), ("POST", "/contexts")):
                with pytest.raises(GuestError, match=f"answer to {method} {path} passed {ANSWER_LIMIT >> 20} MiB"):
                    await asyncio.wait_for(room.call(info.id, method, path, {} if method == "POST" else None), 60)
        for _ in range(150):  # the relays were closed, not left pumping (holding the sandbox awake)
            if not service.activity.in_use(info.id):
                break
            await asyncio.sleep(0.1)
        assert not service.activity.in_use(info.id)

    run(scenario)
