"""Exposed ports: a server in the sandbox, reached through the daemon from a plain client on the host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from websockets.sync.client import connect as ws_connect

from stasis import Client, NetworkPolicy, Sandbox
from tests.conftest import wait_until
from tests.network.servers import COUNTER, TCP_UPPER, WEBSOCKET_ECHO

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # this host's proxy settings: not for us


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str]:
    try:
        with NO_PROXY.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def serve(sbx: Sandbox, program: str, port: int) -> None:
    sbx.start_process(["python3", "-c", program, str(port)], name=f"server-{port}")
    probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
    wait_until(lambda: sbx.run(["python3", "-c", probe]).exit_code == 0, timeout=30, interval=0.2)


@pytest.fixture(params=["namespace", "agent"])
def served(net_client: Client, backend: str, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox whose counter server listens on port 8000: one with a network device and no egress
    (connections go into its namespace), or one with no network at all (they go through its agent)."""
    network = NetworkPolicy.no_egress() if request.param == "namespace" else None
    sbx = Sandbox.create(client=net_client, backend=backend, memory_mb=512, network=network)
    serve(sbx, COUNTER, 8000)
    yield sbx
    sbx.terminate()


def test_exposed_port_needs_its_token_and_wakes_a_suspended_sandbox(served: Sandbox) -> None:
    url = served.expose_port(8000)
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and "stasis_token=" in parts.query
    status, body = get(url)
    assert (status, body) == (200, "1 /")  # the token is not passed on to the app
    bare = f"{parts.scheme}://{parts.netloc}/count"
    status, body = get(bare)
    assert status == 401 and "token" in body
    assert get(bare, {"X-Stasis-Token": "1.forged"})[0] == 401
    token = parts.query.split("=", 1)[1]
    assert get(bare, {"X-Stasis-Token": token}) == (200, "2 /count")
    served.suspend()
    assert served.info().status == "suspended"
    status, body = get(bare, {"Authorization": f"Bearer {token}"})
    assert (status, body) == (200, "3 /count")  # the same process, resumed: its counter went on
    assert served.info().status == "running"
    assert [p.port for p in served.ports()] == [8000]
    served.unexpose_port(8000)
    with pytest.raises(OSError):
        get(bare, timeout=5)


@pytest.mark.parametrize("backend", ["gvisor"])
def test_a_browser_gets_a_cookie_and_public_ports_need_no_token(served: Sandbox) -> None:
    url = served.expose_port(8000)
    with NO_PROXY.open(url, timeout=30) as response:
        cookie = response.headers["set-cookie"].split(";")[0]
    base = url.split("?")[0]
    assert get(base + "asset.js", {"Cookie": cookie}) == (200, "2 /asset.js")
    public = served.expose_port(8000, public=True)
    assert "token" not in public and urlsplit(public).netloc == urlsplit(url).netloc  # the same listener
    assert get(public + "open")[0] == 200
    served.expose_port(8000)  # private again: the bare URL is refused once more
    assert get(public + "closed")[0] == 401
    with pytest.raises(Exception, match="ttl_secs"):
        served.expose_port(8000, ttl_secs=1)


@pytest.mark.parametrize("backend", ["gvisor"])
def test_websocket_echo_through_an_exposed_port(served: Sandbox) -> None:
    serve(served, WEBSOCKET_ECHO, 8765)
    url = served.expose_port(8765).replace("http://", "ws://")
    with ws_connect(url, open_timeout=30) as ws:
        ws.send("hello")
        assert ws.recv(timeout=10) == "hello"
        ws.send(b"\x00\x01" * 1000)
        assert ws.recv(timeout=10) == b"\x00\x01" * 1000


@pytest.mark.parametrize("backend", ["gvisor"])
def test_port_forward_carries_raw_tcp(served: Sandbox, net_daemon) -> None:  # type: ignore[no-untyped-def]
    serve(served, TCP_UPPER, 5432)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        local = free.getsockname()[1]
    env = {**os.environ, **net_daemon.env}
    forward = subprocess.Popen(
        [sys.executable, "-m", "stasis", "port-forward", served.id, f"{local}:5432"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", local), timeout=10)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline and forward.poll() is None, "port-forward did not listen"
                time.sleep(0.1)
        with conn, conn.makefile("rwb") as stream:
            for line in (b"select 1;\n", b"x" * 100_000 + b"\n"):
                stream.write(line)
                stream.flush()
                assert stream.readline() == line.upper()
    finally:
        forward.terminate()
        forward.wait(timeout=10)
