"""The secrets' broker over real sockets on loopback: a sandbox's side (a TLS client trusting its CA), the broker's
interception as the egress proxy runs it, and a host that records every request it reads. The value goes only
into requests that name a bound host; a head two parsers could read two ways is a 400 and reaches no host."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from stasis.credentials.authority import Authorities
from stasis.credentials.broker import SecretBroker
from stasis.credentials.models import SecretRequest
from stasis.credentials.store import SecretStore
from stasis.models import SandboxSpec, build
from stasis.network import sniff

pytestmark = pytest.mark.fast
PH, OTHER_PH = "stasis-secret-" + "a" * 32, "stasis-secret-" + "b" * 32
VALUE, OTHER_VALUE = "the-real-value", "the-other-real-value"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Host:
    """api.test as the bound host: keeps each whole request it reads, and answers it with a 200."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body) as they arrived

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.lower().split(b"\r\n")
                if b"transfer-encoding: chunked" in lines:  # the tests' chunked bodies are one chunk and the end
                    body = await reader.readuntil(b"0\r\n\r\n")
                else:
                    length = next((int(line[15:]) for line in lines if line.startswith(b"content-length:")), 0)
                    body = await reader.readexactly(length)
                self.requests.append((head, body))
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def header(self, index: int, name: str) -> str | None:
        lines = self.requests[index][0].decode().split("\r\n")[1:]
        return next((v.strip() for k, _, v in (line.partition(":") for line in lines) if k.lower() == name), None)


def through_the_proxy(
    tmp_path: Path,
    scenario: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    body: bool = False,
    egress_headers: dict[str, dict[str, str]] | None = None,
    host: Host | None = None,
) -> tuple[Host, dict[str, Any]]:
    """Run ``scenario`` on a sandbox's TLS connection to api.test through the broker; what the host read, and what
    the broker adds to the connection's audit line."""
    store = SecretStore(tmp_path / "secrets")
    store.put("TOKEN", SecretRequest(value=VALUE, hosts=["api.test"], body=body))
    store.put("OTHER", SecretRequest(value=OTHER_VALUE, hosts=["other.test"]))
    spec = build(
        SandboxSpec, network=True, secrets={"TOKEN": PH, "OTHER": OTHER_PH}, egress_headers=egress_headers or {}
    )
    authorities = Authorities(tmp_path / "cas")
    broker = SecretBroker(lambda team: store, authorities, lambda sandbox_id: spec)
    real_ca = Authorities(tmp_path / "real-ca").get("1" * 32)  # the host's own certificate, which the broker checks
    broker.upstream = ssl.create_default_context(cadata=real_ca.cert_pem.decode())
    host = host or Host()

    async def main() -> dict[str, Any]:
        upstream = await asyncio.start_server(host.serve, "127.0.0.1", 0, ssl=real_ca.server_context("api.test"))
        audit: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            first = b""
            while not sniff.complete("tls", first):
                first += await reader.read(sniff.PEEK_BYTES)
            name = sniff.claimed_name("tls", first)
            assert name == "api.test" and broker.bound("sbx", name)
            port = upstream.sockets[0].getsockname()[1]
            destination = (ipaddress.IPv4Address("127.0.0.1"), port)
            audit.set_result(await broker.intercept("sbx", (reader, writer), first, destination, name, lambda: None))

        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        async with upstream, server:
            assert spec.ca_lineage is not None
            trusting = ssl.create_default_context(cadata=authorities.get(spec.ca_lineage).cert_pem.decode())
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.sockets[0].getsockname()[1], ssl=trusting, server_hostname="api.test"
            )
            try:
                await asyncio.wait_for(scenario(reader, writer), 10)
            finally:
                writer.close()
            return await asyncio.wait_for(audit, 10)

    return host, asyncio.run(main())


def requests(*heads: str) -> bytes:
    return b"".join(("\r\n".join(lines.split("|")) + "\r\n\r\n").encode() for lines in heads)


def test_only_a_request_naming_a_bound_host_gets_the_value(tmp_path: Path) -> None:
    """Domain fronting: on a connection to the bound name, each request counts by the names it gives (its Host,
    an absolute target, a CONNECT's authority); a kept-alive request naming another host gets the placeholder."""
    sent = requests(
        f"GET /1 HTTP/1.1|Host: api.test|Authorization: Bearer {PH}",
        f"GET /2 HTTP/1.1|Host: other.test|Authorization: Bearer {PH}|X-Other: {OTHER_PH}",
        f"GET https://other.test/3 HTTP/1.1|Host: api.test|Authorization: Bearer {PH}",
        f"GET /4 HTTP/1.1|Authorization: Bearer {PH}",  # no Host: no name, no value
        f"GET /5 HTTP/1.1|Host: API.test.:443|Authorization: Bearer {PH}",
        f"CONNECT other.test:443 HTTP/1.1|Host: api.test|Authorization: Bearer {PH}",
    )

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        for _ in range(6):
            assert await reader.readuntil(OK[-4:]) == OK

    rule = {"api.test": {"X-Rule": "key ${secrets.TOKEN}"}}
    host, audit = through_the_proxy(tmp_path, scenario, egress_headers=rule)
    assert [host.header(i, "authorization") for i in range(6)] == [
        f"Bearer {VALUE}", f"Bearer {PH}", f"Bearer {PH}", f"Bearer {PH}", f"Bearer {VALUE}", f"Bearer {PH}"
    ]  # fmt: skip
    assert [host.header(i, "x-rule") for i in range(6)] == [f"key {VALUE}", None, None, None, f"key {VALUE}", None]
    assert host.header(1, "x-other") == OTHER_PH  # bound to other.test, but the connection went to api.test
    assert OTHER_VALUE.encode() not in b"".join(head for head, _ in host.requests)
    assert audit["secrets"] == ["TOKEN"] and "error" not in audit


BAD_HEADS = [
    # The repro: the host (lenient) reads a bare-LF head whose body is the next request, value and all.
    ("bare LF", b"POST /a HTTP/1.1\nHost: api.test\nContent-Length: 70\n\n", "bare CR or LF"),
    ("obs-fold", b"GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: 1\r\n folded\r\n\r\n", "folded"),
    ("duplicate length", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
     "more than one content-length"),
    ("conflicting length", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\nContent-Length: 80\r\n\r\nabc",
     "more than one content-length"),
    ("length list", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3, 3\r\n\r\nabc", "not a number"),
    ("length and chunked", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "both content-length and transfer-encoding"),
    ("space before colon", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length : 3\r\n\r\nabc", "NAME: VALUE"),
    ("two hosts", b"GET /a HTTP/1.1\r\nHost: api.test\r\nHost: other.test\r\n\r\n", "more than one host"),
    ("chunk size", b"POST /a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
     "chunk size"),
    ("underscore length", b"POST /a HTTP/1.1\r\nHost: api.test\r\nContent_Length: 80\r\n\r\n", "read as"),
    ("control in a value", b"POST /a HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\x0b\r\n\r\n0\r\n\r\n",
     "control character"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "words"), [case[1:] for case in BAD_HEADS], ids=[case[0] for case in BAD_HEADS])
def test_a_request_two_parsers_could_read_two_ways_is_a_400_and_reaches_no_host(
    tmp_path: Path, data: bytes, words: str
) -> None:
    then = requests(f"GET /b HTTP/1.1|Host: api.test|Authorization: Bearer {PH}")
    answer = b""

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answer
        writer.write(data + then)
        answer = await reader.read()  # the 400, then the end of the connection

    host, audit = through_the_proxy(tmp_path, scenario)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n") and words.encode() in answer, answer
    assert host.requests == []
    assert words in audit["error"] and audit["secrets"] == []  # the connection's one audit line says why


def test_a_body_secret_leaves_a_get_without_a_content_length(tmp_path: Path) -> None:
    sent = (
        requests("GET /1 HTTP/1.1|Host: api.test")
        + requests(f"POST /2 HTTP/1.1|Host: api.test|Content-Length: {len(PH) + 2}")
        + f'"{PH}"'.encode()
    )

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(sent)
        for _ in range(2):
            assert await reader.readuntil(OK[-4:]) == OK

    host, audit = through_the_proxy(tmp_path, scenario, body=True)
    assert host.requests[0] == (b"GET /1 HTTP/1.1\r\nHost: api.test\r\n\r\n", b"")
    assert host.requests[1][1] == f'"{VALUE}"'.encode() and host.header(1, "content-length") == str(len(VALUE) + 2)
    assert audit["secrets"] == ["TOKEN"]


class Counting(Host):
    """A host that counts a body's bytes as they arrive."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            while data := await reader.read(1 << 16):
                self.received += len(data)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def test_a_huge_chunk_is_passed_on_as_it_comes_never_held_whole(tmp_path: Path) -> None:
    """The review's finding: a chunk size of 64 MiB made the broker wait for the whole chunk in the daemon's
    memory. Without a body secret it is passed on as it arrives: the host has the first MiB before the rest."""
    host = Counting()

    async def scenario(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(requests("POST /upload HTTP/1.1|Host: api.test|Transfer-Encoding: chunked"))
        writer.write(b"%x\r\n" % (64 << 20) + b"x" * (1 << 20))
        await writer.drain()
        for _ in range(80):  # the rest never comes: only a relay that streams lets the first MiB through
            if host.received >= 1 << 20:
                return
            await asyncio.sleep(0.1)

    through_the_proxy(tmp_path, scenario, host=host)
    assert host.received >= 1 << 20
