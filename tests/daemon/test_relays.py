"""Relays a sandbox feeds: the ports of a sandbox without network (carried by the real agent on the fake backend),
the E2B face's port proxy over them, and the bounds on what a sandbox's port or kernel server may make the daemon
hold. A relay never drops bytes: it slows the sender down, or its client sees an error."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from stasis.daemon.core.service import SandboxService
from stasis.daemon.faces.e2b.port_proxy import proxy_http
from stasis.daemon.rooms.guest_tcp import open_guest_tcp
from stasis.daemon.rooms.ports import Ports
from stasis.models import ExposePortRequest
from tests.fastkit import create, fake_home, running_service

pytestmark = pytest.mark.fast

MIB = 1 << 20


def run(scenario: Callable[[SandboxService], Awaitable[None]]) -> None:
    async def main() -> None:
        async with running_service(fake_home("relays")) as service:
            await scenario(service)

    asyncio.run(main())


def pattern(size: int) -> bytes:
    """Bytes in which a gap, a repeat or a reordering anywhere changes the digest (and shows in a diff)."""
    return b"".join(i.to_bytes(8, "big") for i in range(size // 8))


@contextlib.contextmanager
def http_server(body: bytes) -> Iterator[int]:
    """A server on the host's loopback (where the fake's agent reaches "its" loopback) answering every request
    with ``body`` as fast as the socket takes it, then closing."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
                with contextlib.suppress(OSError):
                    connection.sendall(head.encode() + body)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


async def slow_read(reader: asyncio.StreamReader, stall: float) -> bytes:
    """Everything, read by a client that lags: nothing for ``stall`` seconds, then small reads with pauses."""
    await asyncio.sleep(stall)
    data = bytearray()
    while chunk := await reader.read(256 * 1024):
        data += chunk
        if len(data) % (8 * MIB) < 256 * 1024:
            await asyncio.sleep(0.2)
    return bytes(data)


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_an_exposed_port_without_network_delivers_64_mib_whole_to_a_slow_client() -> None:
    """The agent used to keep 8 MiB for a lagging reader and drop the rest: HTTP 200 with 12-17 MB of 64."""
    body = pattern(64 * MIB)

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "quiet")  # no network device: the agent carries the connection
        assert info.spec.network is None
        ports = Ports(service, service.tables.ports)
        await ports.start()
        try:
            with http_server(body) as port:
                exposed = await ports.expose(info.id, ExposePortRequest(port=port, public=True))
                host, listen = exposed.listen.rsplit(":", 1)
                reader, writer = await asyncio.open_connection(host, int(listen))
                writer.write(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
                answer = await asyncio.wait_for(slow_read(reader, stall=3.0), 240)
                writer.close()
        finally:
            await ports.close()
        head, _, received = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and f"content-length: {len(body)}".encode() in head
        assert len(received) == len(body)
        assert hashlib.sha256(received).digest() == hashlib.sha256(body).digest()

    run(scenario)


class Asgi:
    """An ASGI server's side of one request, whose client reads slowly: each body part is taken after a pause."""

    def __init__(self, pause: float) -> None:
        self.pause = pause
        self.status = 0
        self.body = bytearray()
        self.complete = False

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            await asyncio.sleep(3.0)  # the client takes nothing for a while: the sandbox's server runs ahead
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")
            self.complete = not message.get("more_body", False)
            if len(self.body) % (4 * MIB) < 65536:
                await asyncio.sleep(self.pause)


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_the_e2b_port_proxy_delivers_a_large_answer_whole_to_a_slow_client() -> None:
    body = pattern(32 * MIB)

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "e2b-quiet")
        client = Asgi(pause=0.2)
        scope = {"type": "http", "method": "GET", "path": "/big", "raw_path": b"/big", "query_string": b"",
                 "headers": [(b"host", b"49999-sbx.e2b.test")]}  # fmt: skip
        with http_server(body) as port:
            await asyncio.wait_for(
                proxy_http(Ports(service, service.tables.ports), info.id, port, scope, client.receive, client.send), 240
            )
        assert (client.status, client.complete, len(client.body)) == (200, True, len(body))
        assert hashlib.sha256(client.body).digest() == hashlib.sha256(body).digest()

    run(scenario)


def test_a_port_whose_answer_breaks_off_leaves_the_e2b_response_unfinished() -> None:
    """An answer cut short (the sandbox's server died mid-body) is an error the client sees, never a short 200
    that looks whole: the proxy does not finish the response (its server then closes the connection)."""
    server = socket.create_server(("127.0.0.1", 0))

    def cut_short() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n" + b"x" * 1000)

    threading.Thread(target=cut_short, daemon=True).start()

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "e2b-cut")
        client = Asgi(pause=0)
        scope = {"type": "http", "method": "GET", "path": "/", "raw_path": b"/", "query_string": b"", "headers": []}
        port = server.getsockname()[1]
        await asyncio.wait_for(
            proxy_http(Ports(service, service.tables.ports), info.id, port, scope, client.receive, client.send), 60
        )
        assert client.status == 200 and len(client.body) == 1000 and not client.complete

    try:
        run(scenario)
    finally:
        server.close()


def test_a_client_that_reads_at_once_gets_every_byte_too() -> None:
    """Even a prompt reader lagged the agent (every chunk is a call over the channel): bytes went then too."""
    body = pattern(16 * MIB)

    async def scenario(service: SandboxService) -> None:
        info = await create(service, "prompt-reader")
        with http_server(body) as port:
            reader, writer = await open_guest_tcp(service, info.id, port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(-1), 120)
            writer.close()
        assert answer.partition(b"\r\n\r\n")[2] == body

    run(scenario)
