"""A networked sandbox across its lifecycle: forks, suspend, a daemon SIGKILLed (also in the middle
of making or removing a network), with nothing leaked on the host."""

from __future__ import annotations

import base64
import errno
import json
import time

import pytest

from stasis import CheckpointType, Client, NetworkPolicy, Sandbox
from stasis.network import namespaces
from tests.conftest import Daemon
from tests.daemon.test_crash_recovery import NETWORK_POINTS, crash_during
from tests.network.conftest import fetch
from tests.network.servers import COUNTER
from tests.network.test_ports import get, serve
from tests.network.testhosts import TestHost


def namespaces_of(daemon: Daemon) -> set[str]:
    return namespaces.sandbox_ids(daemon.paths.runtime.name)


def start(daemon: Daemon, hosts: dict[str, TestHost], **env: str) -> Daemon:
    """(Re)start a daemon of the test's own that resolves through the test hosts' DNS."""
    daemon.sticky_env["STASIS_DNS_UPSTREAM"] = hosts["web"].address
    return daemon.start(**env)


def test_two_forks_of_a_memory_checkpoint_each_get_their_own_network(
    net_client: Client, backend: str, hosts: dict[str, TestHost], net_daemon: Daemon
) -> None:
    web = hosts["web"]
    parent = Sandbox.create(client=net_client, backend=backend, memory_mb=512, network=True)
    forks: list[Sandbox] = []
    try:
        serve(parent, COUNTER, 8000)
        assert get(parent.expose_port(8000))[1] == "1 /"
        checkpoint = parent.checkpoint(CheckpointType.MEMORY)
        forks = [Sandbox.create(client=net_client, snapshot_id=checkpoint.id) for _ in range(2)]
        assert {parent.id, *(f.id for f in forks)} <= namespaces_of(net_daemon)
        for fork in forks:
            for url in (f"http://{web.address}/", "http://allowed.test/"):
                answer = fetch(fork, url)
                assert answer.get("ok", "").startswith("hello from web"), (fork.id, url, answer)
            assert get(fork.expose_port(8000))[1] == "2 /"  # each fork's counter goes on from the checkpoint's
        assert get(parent.expose_port(8000))[1] == "2 /"
        Sandbox.delete_checkpoint(checkpoint.id, client=net_client)
    finally:
        for sbx in [parent, *forks]:
            sbx.terminate()
    assert not {parent.id, *(f.id for f in forks)} & namespaces_of(net_daemon)


def test_policy_and_ports_survive_a_daemon_sigkill(own_daemon: Daemon, hosts: dict[str, TestHost],
                                                    backend: str) -> None:  # fmt: skip
    web, other = hosts["web"], hosts["other"]
    start(own_daemon, hosts)
    sbx = Sandbox.create("kept", client=own_daemon.client(), memory_mb=512, backend=backend,
                         network=NetworkPolicy(allow_out=[f"{web.address}/30"]))  # fmt: skip
    serve(sbx, COUNTER, 8000)
    url = sbx.expose_port(8000)
    assert get(url)[1] == "1 /"
    own_daemon.kill()
    start(own_daemon, hosts)
    sbx = Sandbox.connect("kept", client=own_daemon.client())
    assert sbx.info().spec.network == NetworkPolicy(allow_out=[f"{web.address}/30"])
    assert fetch(sbx, f"http://{web.address}/")["ok"].startswith("hello from web")
    assert fetch(sbx, f"http://{other.address}/").get("errno") == errno.ECONNRESET
    assert get(url)[1] == "2 /"  # the same URL: its listener was opened again on the same port
    sbx.suspend()
    own_daemon.kill()
    start(own_daemon, hosts)
    assert get(url)[1] == "3 /"  # a suspended sandbox, a new daemon: the request resumes it
    assert fetch(sbx, f"http://{other.address}/").get("errno") == errno.ECONNRESET


@pytest.mark.parametrize("point", [p for p in NETWORK_POINTS if ".attach." in p])
def test_kill_while_making_a_network(own_daemon: Daemon, hosts: dict[str, TestHost], point: str) -> None:
    start(own_daemon, hosts, STASIS_KILL_POINT=point)
    crash_during(own_daemon, lambda: Sandbox.create("netborn", client=own_daemon.client(), network=True))
    assert Sandbox.list(client=own_daemon.client()) == []
    assert namespaces_of(own_daemon) == set()  # the create was rolled back, its namespaces too
    sbx = Sandbox.create("netborn", client=own_daemon.client(), network=True)
    assert "ok" in fetch(sbx, f"http://{hosts['web'].address}/")


@pytest.mark.parametrize("point", [p for p in NETWORK_POINTS if ".detach." in p])
def test_kill_while_removing_a_network(own_daemon: Daemon, hosts: dict[str, TestHost], point: str) -> None:
    start(own_daemon, hosts, STASIS_KILL_POINT=point)
    sbx = Sandbox.create("netdoomed", client=own_daemon.client(), network=True)
    crash_during(own_daemon, sbx.terminate)
    assert Sandbox.list(client=own_daemon.client()) == []
    assert namespaces_of(own_daemon) == set()


@pytest.mark.parametrize("point", ["gvisor.resume.before_restore", "gvisor.resume.after_restore"])
def test_kill_around_a_networked_resume(own_daemon: Daemon, hosts: dict[str, TestHost], point: str) -> None:
    start(own_daemon, hosts)
    sbx = Sandbox.create("netnap", client=own_daemon.client(), network=True)
    sbx.suspend()
    own_daemon.stop()
    start(own_daemon, hosts, STASIS_KILL_POINT=point)
    crash_during(own_daemon, sbx.resume)
    sbx = Sandbox.connect("netnap", client=own_daemon.client())
    assert "ok" in fetch(sbx, f"http://{hosts['web'].address}/")


LONG_CONNECTION = r"""
import http.client, json, os, sys, time
conn = http.client.HTTPConnection(sys.argv[1], 80, timeout=10)
conn.request("GET", "/"); first = conn.getresponse().read().decode()
open("/root/first-done", "w").close()
while not os.path.exists("/root/go"):
    time.sleep(0.05)
try:
    conn.request("GET", "/"); second = conn.getresponse().read().decode()
except Exception as exc:
    second = f"{type(exc).__name__}"
conn = http.client.HTTPConnection(sys.argv[1], 80, timeout=10)
conn.request("GET", "/"); third = conn.getresponse().read().decode()
print(json.dumps([first, second, third]))
"""


def test_established_connections_across_a_suspend(net_client: Client, backend: str, hosts: dict[str, TestHost]) -> None:
    """Listening sockets keep listening (see test_ports); a connection open at the suspend is cut on
    gVisor (runsc --net-disconnect-ok) and lives on in a microVM, whose kernel keeps its TCP state; a
    new connection works on both."""
    web = hosts["web"]
    sbx = Sandbox.create(client=net_client, backend=backend, memory_mb=512, network=True)
    try:
        proc = sbx.start_process(["python3", "-c", LONG_CONNECTION, web.address])
        deadline = time.monotonic() + 30
        while sbx.run("test -e /root/first-done").exit_code != 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        sbx.suspend()
        sbx.resume()
        sbx.write_file("/root/go", b"")
        deadline = time.monotonic() + 60
        while sbx.get_process(proc.id).exit_code is None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        first, second, third = json.loads(base64.b64decode(sbx.process_output(proc.id).data_b64))
        assert first.startswith("hello from web") and third.startswith("hello from web")
        if backend == "gvisor":
            assert not second.startswith("hello"), second
        else:
            assert second.startswith("hello from web"), second
    finally:
        sbx.terminate()
