"""The egress proxy's cap on one sandbox's open connections, and accepts that fail for want of descriptors: on
plain loopback sockets (the proxy's listener as the daemon opens it, minus the namespace and nftables)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from stasis.netpolicy import NetworkPolicy
from stasis.network import egress
from stasis.network.egress import EgressProxy
from stasis.network.relay import relay
from stasis.network.resolver import ResolvedNames

pytestmark = pytest.mark.fast
CAP = 4


async def refused(port: int) -> bool:
    """Whether a new connection is closed by the proxy at once (reset, or ended before it said anything)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await asyncio.wait_for(reader.read(1), 5) == b""
    except ConnectionResetError:
        return True
    finally:
        writer.close()


async def held(port: int) -> asyncio.StreamWriter:
    """A connection that says nothing: the proxy waits for its TLS ClientHello (it stays open)."""
    return (await asyncio.open_connection("127.0.0.1", port))[1]


async def until(check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the proxy never got there")


def test_over_the_cap_connections_are_refused_and_audited_once_per_episode(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """11,000 held connections used to pin the daemon at its descriptor limit and log 77,000 tracebacks."""
    monkeypatch.setattr(egress, "original_destination", lambda sock: (ipaddress.ip_address("127.0.0.1"), 443))
    audit: list[dict[str, Any]] = []
    proxy = EgressProxy("sb-capped", NetworkPolicy, ResolvedNames(), lambda ip: False, lambda: None, audit.append,
                        max_open=CAP)  # fmt: skip

    def cap_lines() -> list[dict[str, Any]]:
        return [line for line in audit if "over the cap" in line["rule"]]

    async def main() -> None:
        server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        holding = [await held(port) for _ in range(CAP)]
        await until(lambda: proxy.open == CAP)
        assert all([await refused(port) for _ in range(30)])
        assert len(cap_lines()) == 1 and cap_lines()[0]["verdict"] == "denied"
        assert cap_lines()[0]["destination"] == "127.0.0.1" and cap_lines()[0]["port"] == 443
        for writer in holding:
            writer.close()
        await until(lambda: proxy.open == 0)
        holding = [await held(port) for _ in range(CAP)]  # under the cap again: accepted, held
        await until(lambda: proxy.open == CAP)
        assert await refused(port) and len(cap_lines()) == 2  # a new episode: audited once more
        for writer in holding:
            writer.close()
        await until(lambda: proxy.open == 0)
        server.close()

    with caplog.at_level(logging.DEBUG, logger="stasis.network.egress"):
        asyncio.run(main())
    assert not [r for r in caplog.records if r.exc_info], "a traceback for a refused connection"
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 2  # one per episode


HOLDER = """
import asyncio, logging, resource, sys, time
from stasis.daemon.faces.accepts import quiet_accept_failures
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
resource.setrlimit(resource.RLIMIT_NOFILE, (32, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
async def main():
    quiet_accept_failures(asyncio.get_running_loop())
    held = []
    async def hold(reader, writer):
        held.append(writer)
    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    cpu = time.process_time()
    await asyncio.sleep(float(sys.argv[1]))
    print(time.process_time() - cpu, flush=True)  # its CPU while its accepts failed: a busy loop would take seconds
asyncio.run(main())
"""


@pytest.mark.slow  # seconds of its own: the full suite runs it, the fast tier not
def test_accepts_failing_with_emfile_neither_spin_nor_log_tracebacks(tmp_path: Path) -> None:
    """A listener out of descriptors: asyncio retried each second and logged a traceback each time."""
    import socket

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with (tmp_path / "stderr").open("w+") as stderr:
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, "4.5"], stdout=subprocess.PIPE, stderr=stderr,
                                  env=env, text=True)  # fmt: skip
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        clients = []
        for _ in range(60):  # more than its 32 descriptors: its accepts fail with EMFILE
            client = socket.socket()
            client.settimeout(2)
            try:
                client.connect(("127.0.0.1", port))
            except OSError:
                client.close()
                break
            clients.append(client)
        started = time.monotonic()
        holder.wait(30)
        cpu_while_failing = float(holder.stdout.readline())
        for client in clients:
            client.close()
        stderr.seek(0)
        said = stderr.read()
    assert holder.returncode == 0 and time.monotonic() - started > 2  # it ran with accepts failing for seconds
    assert "Traceback" not in said and said.count("cannot accept connections: Too many open files") == 1, said
    assert cpu_while_failing < 1.0  # no busy loop (one spinning for its 4.5 s takes seconds, loaded or not)


def test_the_daemons_cap_holds_over_every_sandboxs_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten sandboxes each under their own cap could still hold every descriptor the daemon has."""
    monkeypatch.setattr(egress, "original_destination", lambda sock: (ipaddress.ip_address("127.0.0.1"), 443))
    audit: list[dict[str, Any]] = []
    proxies = [EgressProxy(f"sb-{n}", NetworkPolicy, ResolvedNames(), lambda ip: False, lambda: None, audit.append,
                           max_open=CAP, daemon_max_open=CAP + 2) for n in range(2)]  # fmt: skip

    async def main() -> None:
        servers = [await asyncio.start_server(proxy.handle, "127.0.0.1", 0) for proxy in proxies]
        first, second = (server.sockets[0].getsockname()[1] for server in servers)
        holding = [await held(first) for _ in range(CAP)] + [await held(second) for _ in range(2)]
        await until(lambda: EgressProxy.all_open == CAP + 2)
        assert await refused(second)  # its own cap is far off, the daemon's is reached
        assert "the daemon's cap of 6" in audit[-1]["rule"]
        for writer in holding:
            writer.close()
        await until(lambda: EgressProxy.all_open == 0)
        for server in servers:
            server.close()

    asyncio.run(main())


def test_a_remote_that_never_closes_holds_no_slot_after_the_sandbox_closed() -> None:
    """1,024 connections to a tarpit sat in FIN-WAIT-2 for good: the proxy waited for a FIN that never came."""

    async def main() -> None:
        held_by_tarpit: list[asyncio.StreamReader] = []

        async def tarpit(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held_by_tarpit.append(reader)  # reads nothing, says nothing, never closes

        async def slow_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # the request, to its end (the sandbox's half-close)
            for _ in range(10):  # then an answer in dribs, each well inside the idle time
                writer.write(b".")
                await writer.drain()
                await asyncio.sleep(0.05)
            writer.close()

        outcomes: list[tuple[int, int]] = []

        async def proxied(upstream_port: int, idle: float) -> int:
            async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                upstream = await asyncio.open_connection("127.0.0.1", upstream_port)
                outcomes.append(await relay((reader, writer), upstream, half_closed_idle=idle))

            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            servers.append(server)
            return int(server.sockets[0].getsockname()[1])

        servers = [await asyncio.start_server(answer, "127.0.0.1", 0) for answer in (tarpit, slow_answer)]
        tarpit_port, slow_port = (server.sockets[0].getsockname()[1] for server in servers)
        reader, writer = await asyncio.open_connection("127.0.0.1", await proxied(tarpit_port, 0.3))
        writer.write(b"hello")
        writer.write_eof()  # the sandbox is done; the remote never will be
        await until(lambda: len(outcomes) == 1)
        assert outcomes[0] == (5, 0)
        assert await asyncio.wait_for(held_by_tarpit[0].read(), 30) == b"hello"  # the half-close reached it first
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", await proxied(slow_port, 5.0))
        writer.write(b"request")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 60) == b"." * 10  # an answer that keeps coming is all relayed
        await until(lambda: len(outcomes) == 2)
        assert outcomes[1] == (7, 10)
        writer.close()
        for server in servers:
            server.close()

    asyncio.run(main())
