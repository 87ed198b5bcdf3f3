"""Egress policy, enforced on the host: what a sandbox can and cannot connect to.

Every destination is a test host of this session (tests/network/testhosts.py) or an address
that never leaves the sandbox's gateway namespace (the daemon's proxy refuses it there).

The policy is one engine on the host for both backends: how a sandbox's traffic reaches it (the path, nothing
private by default, no way to the daemon or a neighbour, the audit and the meter) is tested on both; the rules'
own logic on gVisor alone (`ON_GVISOR`), where a microVM on TCG would cost ten times as much for the same code.
"""

from __future__ import annotations

import errno
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from stasis import Client, NetworkPolicy, Sandbox
from stasis.sdk import team as teams
from tests.conftest import Daemon
from tests.network.conftest import fetch, probe
from tests.network.testhosts import TestHost

REFUSED_OR_RESET = {errno.ECONNREFUSED, errno.ECONNRESET}
ON_GVISOR = pytest.mark.parametrize("backend", ["gvisor"])  # the rules' logic: the host's, whatever the backend


@pytest.fixture
def make(net_client: Client, backend: str) -> Iterator:
    made: list[Sandbox] = []

    def create(network: object) -> Sandbox:
        made.append(Sandbox.create(client=net_client, backend=backend, memory_mb=512, network=network))
        return made[-1]

    yield create
    for sbx in made:
        sbx.terminate()


def denied(result: dict) -> bool:
    """The connection was reset or refused, as a denied one is (one let through to nothing would time out)."""
    return result.get("errno") in REFUSED_OR_RESET


def test_internet_reaches_a_public_host_by_ip_and_name_and_nothing_private(make, hosts: dict[str, TestHost]) -> None:
    sbx = make(True)
    web = hosts["web"]
    assert fetch(sbx, f"http://{web.address}/")["ok"].startswith("hello from web")
    assert fetch(sbx, "http://allowed.test/")["ok"] == "hello from web (Host: allowed.test)"
    for address in (hosts["private"].address, "169.254.169.254", web.peer, "10.200.0.1"):
        result = fetch(sbx, f"http://{address}/")
        assert denied(result), (address, result)


@ON_GVISOR
def test_allow_list_denies_everything_else(make, hosts: dict[str, TestHost]) -> None:
    web, other = hosts["web"], hosts["other"]
    sbx = make(NetworkPolicy(allow_out=["allowed.test", f"{other.address}/32"]))
    # web's address is not allowed as such: only once the sandbox resolved allowed.test to it
    assert denied(fetch(sbx, f"http://{web.address}/"))
    assert fetch(sbx, "http://allowed.test/")["ok"].startswith("hello from web")
    assert fetch(sbx, f"http://{other.address}/")["ok"].startswith("hello from other")  # by CIDR
    for name in ("denied.test", "private.test", "x.wild.test"):
        result = probe(sbx, "dns", name)
        assert result["error"] == "gaierror", (name, result)  # the resolver refused the name
    assert denied(fetch(sbx, f"http://{hosts['private'].address}/"))


@ON_GVISOR
def test_deny_wins_over_allow_both_ways(make, hosts: dict[str, TestHost]) -> None:
    other = hosts["other"]
    # allowed by name, denied by CIDR: refused by the firewall before any byte is sent
    by_cidr = make(NetworkPolicy(allow_out=["*.wild.test"], deny_out=[f"{other.address}/30"]))
    result = fetch(by_cidr, "http://a.wild.test/")
    assert result.get("errno") == errno.ECONNREFUSED, result
    # allowed by CIDR, denied by name: the name does not resolve, and claiming it in Host is reset
    by_name = make(NetworkPolicy(allow_out=[f"{other.address}/30"], deny_out=["denied.test"]))
    assert probe(by_name, "dns", "denied.test")["error"] == "gaierror"
    assert denied(fetch(by_name, f"http://{other.address}/", {"Host": "denied.test"}))
    assert fetch(by_name, f"http://{other.address}/")["ok"].startswith("hello from other")


@ON_GVISOR
def test_a_claimed_name_cannot_open_an_address(make, hosts: dict[str, TestHost]) -> None:
    """SNI and Host can only deny: writing an allowed name there does not open a hard-coded address."""
    other = hosts["other"]
    sbx = make(NetworkPolicy(allow_out=["allowed.test"]))
    assert denied(fetch(sbx, f"http://{other.address}/", {"Host": "allowed.test"}))
    assert denied(probe(sbx, "tls", f"{other.address},443,allowed.test"))
    internet = make(NetworkPolicy(deny_out=["denied.test"]))
    assert denied(probe(internet, "tls", f"{other.address},443,denied.test"))
    handshake = probe(internet, "tls", f"{other.address},443,fine.test")  # a plain HTTP server answers on 443
    assert handshake.get("error") == "SSLError", handshake


@ON_GVISOR
def test_live_update_applies_to_the_next_connection(make, hosts: dict[str, TestHost]) -> None:
    web = hosts["web"]
    sbx = make(True)
    assert "ok" in fetch(sbx, f"http://{web.address}/")
    info = sbx.update_network(NetworkPolicy(deny_out=[web.address]))
    assert info.spec.network == NetworkPolicy(deny_out=[web.address])
    assert fetch(sbx, f"http://{web.address}/").get("errno") == errno.ECONNREFUSED
    sbx.update_network(True)
    assert "ok" in fetch(sbx, f"http://{web.address}/")
    assert sbx.info().spec.network == NetworkPolicy()


@pytest.mark.parametrize("backend", ["gvisor"])
def test_no_egress_and_invalid_rules(make, net_client: Client, hosts: dict[str, TestHost]) -> None:
    sbx = make(NetworkPolicy.no_egress())
    assert denied(fetch(sbx, f"http://{hosts['web'].address}/"))
    assert probe(sbx, "dns", "allowed.test")["error"] == "gaierror"
    from stasis import InvalidRequest

    with pytest.raises(InvalidRequest, match=r"invalid network rule 'not a host'.*CIDR"):
        Sandbox.create(client=net_client, network=NetworkPolicy.model_construct(allow_out=["not a host"]))


def test_a_sandbox_reaches_neither_the_daemon_nor_another_sandbox(make, hosts: dict[str, TestHost]) -> None:
    from tests.network.servers import COUNTER
    from tests.network.test_ports import get, serve

    server = make(NetworkPolicy.no_egress())
    serve(server, COUNTER, 8000)
    url = server.expose_port(8000, public=True)
    listen_port = url.rsplit(":", 1)[1].strip("/")
    assert get(url)[0] == 200  # from the host, through the daemon
    other = make(NetworkPolicy(allow_out=["*"]))  # everything a policy can open
    # 127.0.0.1 is the sandbox's own loopback; 10.200.0.2 is itself (every sandbox's address):
    # nothing of another sandbox is addressable from inside one.
    for address in ("127.0.0.1", "10.200.0.2"):
        result = probe(other, "url", f"http://{address}:{listen_port}/")
        assert result.get("errno") == errno.ECONNREFUSED, (address, result)
    assert probe(other, "url", "http://10.200.0.2:8000/").get("errno") == errno.ECONNREFUSED
    # The host's own addresses (where a daemon could listen) stay closed even to allow_out ["*"].
    assert denied(probe(other, "url", f"http://{hosts['web'].peer}:{listen_port}/"))
    assert "ok" in fetch(other, f"http://{hosts['other'].address}/")


@ON_GVISOR
def test_a_name_rule_never_opens_a_private_address(make, hosts: dict[str, TestHost]) -> None:
    """private.test resolves to a test host in 10.77/16: a name rule that permits it opens nothing there; the
    same name with a CIDR rule for the range does."""
    private = hosts["private"]
    by_name = make(NetworkPolicy(allow_out=["private.test"]))
    assert probe(by_name, "dns", "private.test")["ok"] == "resolved"
    assert denied(fetch(by_name, "http://private.test/"))
    with_range = make(NetworkPolicy(allow_out=["private.test", f"{private.address}/30"]))
    assert fetch(with_range, "http://private.test/")["ok"].startswith("hello from private")


@ON_GVISOR
def test_a_connection_that_never_says_its_name_is_refused_where_names_decide(make, hosts: dict[str, TestHost]) -> None:
    """Port 443 with no ClientHello: a policy by name cannot judge it, so it is reset, never let through to the
    test host (whose server waits for a request: a connection let through would hang until the timeout)."""
    sbx = make(NetworkPolicy(deny_out=["denied.test"]))
    result = probe(sbx, "silent", f"{hosts['other'].address},443", "40")
    assert result.get("errno") in REFUSED_OR_RESET or result.get("ok") == "closed", result


@ON_GVISOR
def test_an_address_the_host_gained_a_moment_ago_is_closed_at_once(make, hosts: dict[str, TestHost]) -> None:
    """The host's own addresses are asked at each connection, not cached: one added to this host now (on the
    private test host's link, in this session's own 10.77 block) is refused even to a policy that opens
    its range, and nothing listening there is reached."""
    private = hosts["private"]
    fresh = private.address.rsplit(".", 1)[0] + ".100"
    sbx = make(NetworkPolicy(allow_out=[f"{fresh.rsplit('.', 1)[0]}.0/24"]))
    assert fetch(sbx, f"http://{private.address}/")["ok"].startswith("hello from private")  # the proxy works
    subprocess.run(["ip", "addr", "add", f"{fresh}/32", "dev", private.outside], check=True)
    server = http.server.HTTPServer((fresh, 8080), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = fetch(sbx, f"http://{fresh}:8080/")
        assert denied(result), result
    finally:
        server.shutdown()
        server.server_close()
        subprocess.run(["ip", "addr", "del", f"{fresh}/32", "dev", private.outside], check=False)


def test_every_connection_is_audited_allowed_or_denied_with_its_rule_and_bytes(
    make, hosts: dict[str, TestHost], net_daemon: Daemon, net_client: Client
) -> None:
    web, other = hosts["web"], hosts["other"]
    sbx = make(NetworkPolicy(allow_out=["allowed.test"]))
    answer = fetch(sbx, "http://allowed.test/")["ok"]
    assert denied(fetch(sbx, f"http://{other.address}/"))
    lines = sbx.egress_log()
    allowed = next(line for line in lines if line["verdict"] == "allowed")
    assert (allowed["destination"], allowed["port"], allowed["name"]) == (web.address, 80, "allowed.test")
    assert allowed["rule"] == "allow_out allowed.test" and allowed["bytes_in"] > len(answer) > 0
    assert allowed["bytes_out"] > 0 and allowed["sandbox"] == sbx.id
    refused = next(line for line in lines if line["verdict"] == "denied")
    assert refused["destination"] == other.address and "matches no allow_out rule" in refused["rule"]
    followed = sbx.follow_egress()
    assert next(followed)["verdict"] in ("allowed", "denied")  # the kept lines first, then new ones as they come
    fetch(sbx, "http://allowed.test/again")
    assert any(line.get("bytes_in") and line["verdict"] == "allowed" for line in (next(followed) for _ in range(2)))
    followed.close()
    shown = subprocess.run([sys.executable, "-m", "stasis", "egress", sbx.id], capture_output=True, text=True,
                           env=net_daemon.env, timeout=120)  # fmt: skip
    assert "allowed" in shown.stdout and "denied" in shown.stdout and "allowed.test" in shown.stdout, shown.stderr
    # usage counts the same bytes, as they went (not from the log)
    (row,) = [r for r in teams.usage(client=net_client, since=0).sandboxes if r.sandbox_id == sbx.id]
    allowed_lines = [line for line in sbx.egress_log() if line["verdict"] == "allowed"]
    assert row.egress_bytes == sum(line["bytes_out"] for line in allowed_lines) > 0
    assert row.ingress_bytes == sum(line["bytes_in"] for line in allowed_lines) > len(answer)
