"""HTTPS with a secret put in by the egress proxy, beside the same HTTPS without interception.

    .venv/bin/python benchmarks/secret_proxy.py [--rounds N] [--megabytes M] [--backend gvisor|microvm]

One sandbox with a secret bound to api.secret.test; both names below resolve to this run's HTTPS test host
(tests/network/testhosts.py), so the two differ only in the interception:

- intercepted: api.secret.test, the secret's host. The proxy ends the sandbox's TLS (a certificate of the
  sandbox's CA), reads each request, puts the secret in, and makes its own verified TLS connection.
- baseline: echo.secret.test, bound to nothing. The proxy judges the connection and copies its bytes; the
  sandbox's TLS goes to the host itself (the sandbox is given the test CA to verify it, as the proxy is).

Measured inside the sandbox with Python's http.client: a request on a new connection (TCP, TLS handshake,
GET), a request on a kept-alive connection, a download and an upload of M MB. Inside a sandbox both paths
are held to the same speed by the sandbox's side (its TCP stack and its own TLS), so the proxy's own
ceiling is measured too, on the host: the daemon's interception code (stasis.credentials.broker) serving a
download from the test host to a client on loopback, beside the same client talking TLS to the host directly.

Prints medians and ratios; writes benchmarks/results/secret-proxy-BACKEND.json.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test hosts live with the tests

from common import Comparison, report_ratios, serving_daemon, write_results

from stasis import Client, Sandbox, Secret
from stasis.credentials.authority import Authorities
from stasis.credentials.broker import SecretBroker
from stasis.credentials.models import SecretRequest
from stasis.credentials.store import SecretStore
from stasis.models import SandboxSpec
from stasis.network import sniff
from tests.network.testhosts import TestHost, make_hosts

CLIENT = r"""
import http.client, json, os, ssl, sys, time
host, mode, n, cafile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
context = ssl.create_default_context(cafile=None if cafile == "-" else cafile)  # "-": the sandbox's own store
headers = {"Authorization": "Bearer " + os.environ.get("TOKEN", "none")}  # the placeholder
def connect():
    return http.client.HTTPSConnection(host, 443, context=context, timeout=120)
times = []
if mode == "new":
    for _ in range(n):
        started = time.perf_counter()
        c = connect(); c.request("GET", "/bytes/64", headers=headers); c.getresponse().read(); c.close()
        times.append(time.perf_counter() - started)
elif mode == "kept":
    c = connect(); c.request("GET", "/bytes/64", headers=headers); c.getresponse().read()
    for _ in range(n):
        started = time.perf_counter()
        c.request("GET", "/bytes/64", headers=headers); c.getresponse().read()
        times.append(time.perf_counter() - started)
elif mode == "download":
    c = connect(); started = time.perf_counter()
    c.request("GET", f"/bytes/{n}", headers=headers); answer = c.getresponse()
    while answer.read(1 << 20):
        pass
    times.append(time.perf_counter() - started)
else:
    body = b"x" * n
    c = connect(); started = time.perf_counter()
    c.request("POST", "/sink", body=body, headers=headers); assert int(c.getresponse().read()) == n
    times.append(time.perf_counter() - started)
print(json.dumps(times))
"""
TEST_CA = "/tmp/test-host-ca.pem"


def connection_to(address: str, port: int, context: ssl.SSLContext) -> http.client.HTTPSConnection:
    """HTTPS to ``address`` as api.secret.test (a name this host does not resolve)."""
    connection = http.client.HTTPSConnection(address, port, context=context, timeout=120)
    connection.sock = context.wrap_socket(socket.create_connection((address, port)), server_hostname="api.secret.test")
    return connection


def download(connection: http.client.HTTPSConnection, size: int) -> float:
    started = time.perf_counter()
    connection.request("GET", f"/bytes/{size}")
    answer = connection.getresponse()
    while answer.read(1 << 20):
        pass
    connection.close()
    return time.perf_counter() - started


def proxy_alone(web: TestHost, size: int, transfers: int) -> tuple[list[float], list[float], str]:
    """The broker's interception on the host: a loopback listener that hands each connection to it, as the
    egress proxy does, beside the same download over TLS straight to the test host."""
    assert web.tls is not None
    with tempfile.TemporaryDirectory(prefix="stasis-bench-broker-") as scratch:
        store = SecretStore(Path(scratch) / "secrets")
        store.put("TOKEN", SecretRequest(value="bench-value", hosts=["api.secret.test"]))
        spec = SandboxSpec(network=True, secrets=["TOKEN"])
        authorities = Authorities(Path(scratch) / "cas")
        os.environ["STASIS_UPSTREAM_CA"] = str(web.tls.ca)  # as the daemon is told: it trusts the test host
        broker = SecretBroker(store, authorities, lambda sandbox_id: spec)
        assert spec.ca_lineage is not None
        sandbox_ca = Path(scratch) / "sandbox-ca.pem"
        sandbox_ca.write_bytes(authorities.get(spec.ca_lineage).cert_pem)
        loop = asyncio.new_event_loop()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            first = b""
            while not sniff.complete("tls", first) and (data := await reader.read(sniff.PEEK_BYTES)):
                first += data
            await broker.intercept("sb-bench", (reader, writer), first, (web.address, 443), "api.secret.test",
                                   lambda: None)  # type: ignore[arg-type]  # fmt: skip

        server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            through = ssl.create_default_context(cafile=str(sandbox_ca))
            direct = ssl.create_default_context(cafile=str(web.tls.ca))
            ours, base = [], []
            for _ in range(transfers):  # interleaved: the machine's load falls on both alike
                ours.append(download(connection_to("127.0.0.1", port, through), size))
                base.append(download(connection_to(web.address, 443, direct), size))
        finally:
            loop.call_soon_threadsafe(server.close)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
    return ours, base, "TLS straight to it"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--transfers", type=int, default=3, help="downloads and uploads of each kind")
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    hosts = make_hosts()
    web = hosts["web"]
    assert web.tls is not None
    rows: dict[str, Comparison] = {}
    size = args.megabytes << 20
    try:
        env = {"STASIS_DNS_UPSTREAM": web.address, "STASIS_UPSTREAM_CA": str(web.tls.ca)}
        with serving_daemon("stasis-bench-secrets-", **env) as paths, Client(paths) as client:
            Secret.add("TOKEN", "bench-value", hosts=["api.secret.test"], client=client)
            sbx = Sandbox.create(client=client, backend=args.backend, memory_mb=1024, network=True, secrets=["TOKEN"])
            try:
                sbx.write_file(TEST_CA, web.tls.ca.read_bytes())

                def measure(host: str, mode: str, n: int) -> list[float]:
                    cafile = "-" if host == "api.secret.test" else TEST_CA
                    result = sbx.run(["python3", "-c", CLIENT, host, mode, str(n), cafile], timeout=900)
                    assert result.exit_code == 0, result.stderr
                    return list(json.loads(result.stdout))

                def side_by_side(mode: str, n: int, times: int = 1) -> Comparison:
                    ours, base = [], []
                    for _ in range(times):  # interleaved: the machine's load falls on both alike
                        ours += measure("api.secret.test", mode, n)
                        base += measure("echo.secret.test", mode, n)
                    return ours, base, "no interception"

                measure("api.secret.test", "new", 3)  # the leaf certificate is made on the first connection
                rows["request, new connection"] = side_by_side("new", args.rounds)
                rows["request, kept-alive connection"] = side_by_side("kept", args.rounds)
                rows[f"download {args.megabytes} MB"] = side_by_side("download", size, args.transfers)
                rows[f"upload {args.megabytes} MB"] = side_by_side("upload", size, args.transfers)
            finally:
                sbx.terminate()
                Secret.remove("TOKEN", client=client)
        rows[f"proxy alone, on the host: download {args.megabytes} MB"] = proxy_alone(web, size, args.transfers)
    finally:
        for host in hosts.values():
            host.down()
    name = f"secret-proxy-{args.backend}"
    report = report_ratios(f"HTTPS with a secret put in, beside without ({args.backend})", name, rows,
                           {"backend": args.backend, "rounds": args.rounds, "megabytes": args.megabytes})  # fmt: skip
    for operation in ("download", "upload", "proxy alone, on the host: download"):
        row = report[f"{operation} {args.megabytes} MB"]
        ours, base = rows[f"{operation} {args.megabytes} MB"][:2]
        row |= {"stasis_MBps": args.megabytes / statistics.median(ours),
                "baseline_MBps": args.megabytes / statistics.median(base)}  # fmt: skip
        print(f"{operation}: {row['stasis_MBps']:.0f} MB/s intercepted, {row['baseline_MBps']:.0f} MB/s without")
    write_results(name, report)


if __name__ == "__main__":
    main()
