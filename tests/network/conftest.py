"""Fixtures of the network tests: this session's test hosts, and a daemon whose sandboxes resolve
names through the test hosts' DNS server (never through this machine's resolver)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from stasis import Client, Sandbox
from tests.conftest import Daemon, new_home, terminate_all
from tests.network.testhosts import TestHost, make_hosts

# Run in a sandbox: fetch a URL (or open a TCP/TLS connection) and print what happened as JSON.
PROBE = r"""
import json, socket, ssl, sys, time, urllib.request
kind, target = sys.argv[1], sys.argv[2]
started = time.monotonic()
try:
    if kind == "url":
        headers = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
        request = urllib.request.Request(target, headers=headers)
        body = urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).read()
        result = {"ok": body.decode(errors="replace")}
    elif kind == "tls":
        host, port, name = target.split(",")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            ssl.create_default_context().wrap_socket(raw, server_hostname=name)
        result = {"ok": "handshake"}
    elif kind == "silent":  # connect and say nothing: what does the other end do?
        host, port = target.split(",")
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            raw.settimeout(float(sys.argv[3]))
            data = raw.recv(100)
        result = {"ok": "closed" if not data else data.decode(errors="replace")}
    else:
        socket.getaddrinfo(target, 80)
        result = {"ok": "resolved"}
except Exception as exc:
    reason = exc.reason if isinstance(getattr(exc, "reason", None), BaseException) else exc
    result = {"error": type(reason).__name__, "errno": getattr(reason, "errno", None), "text": str(reason)}
result["seconds"] = round(time.monotonic() - started, 3)
print(json.dumps(result))
"""


def probe(sbx: Sandbox, kind: str, target: str, *extra: str) -> dict:
    result = sbx.run(["python3", "-c", PROBE, kind, target, *extra], timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def fetch(sbx: Sandbox, url: str, headers: dict[str, str] | None = None) -> dict:
    return probe(sbx, "url", url, *([json.dumps(headers)] if headers else []))


@pytest.fixture(scope="session")
def hosts() -> Iterator[dict[str, TestHost]]:
    made = make_hosts()
    yield made
    for host in made.values():
        host.down()


@pytest.fixture(scope="session")
def net_daemon(hosts: dict[str, TestHost]) -> Iterator[Daemon]:
    d = Daemon(new_home("net"))
    d.sticky_env["STASIS_DNS_UPSTREAM"] = hosts["web"].address
    assert hosts["web"].tls is not None
    d.sticky_env["STASIS_UPSTREAM_CA"] = str(hosts["web"].tls.ca)  # how the egress proxy trusts our HTTPS host
    d.start()
    yield d
    terminate_all(d)
    d.stop()


@pytest.fixture
def net_client(net_daemon: Daemon) -> Iterator[Client]:
    with net_daemon.client() as c:
        yield c
