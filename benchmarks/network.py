"""Networked sandboxes beside the raw primitives, against this run's own test hosts.

    .venv/bin/python benchmarks/network.py [--rounds N] [--megabytes M] [--backend gvisor|microvm]

- create: `Sandbox.create(network=True)` beside `Sandbox.create()` (namespaces, firewall, the
  daemon's resolver and proxy, runsc --network=sandbox or a tap).
- request: GET through an exposed port's URL (a new connection each: the daemon's listener, its
  token check, a connection into the namespace) beside the same GET straight to the sandbox's
  address from inside its gateway namespace (what the daemon's own connection costs, alone).
- the same GET to a sandbox without network (the connection carried by its agent).
- download: M MB from a test host with Python's urllib inside the sandbox (every byte through the
  daemon's egress proxy) beside the same download on the host.

Prints medians and ratios; writes benchmarks/results/network-BACKEND.json.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the test hosts live with the tests

from common import Comparison, report_ratios, serving_daemon, timed, write_results

from stasis import Client, NetworkPolicy, Sandbox
from stasis.network import namespaces
from stasis.network.namespaces import INNER_ADDRESS, SandboxNet
from tests.network.servers import COUNTER
from tests.network.testhosts import make_hosts

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
DOWNLOAD = """
import sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
started = time.perf_counter()
with opener.open(sys.argv[1], timeout=120) as response:
    while response.read(1 << 20):
        pass
print(time.perf_counter() - started)
"""


def wait_for(url: str) -> None:
    for _ in range(100):
        try:
            NO_PROXY.open(url, timeout=5).read()
            return
        except OSError:
            time.sleep(0.1)


def direct_get(net: SandboxNet, port: int) -> None:
    """GET / from a socket made in the sandbox's gateway namespace (no daemon in between)."""
    with namespaces.inside(net.gateway):
        sock = socket.socket()
    with sock:
        sock.connect((INNER_ADDRESS, port))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while sock.recv(65536):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    hosts = make_hosts()
    web = hosts["web"]
    rows: dict[str, Comparison] = {}
    try:
        with serving_daemon("stasis-bench-net-", STASIS_DNS_UPSTREAM=web.address) as paths:
            client = Client(paths)

            def create(network: object) -> None:
                Sandbox.create(client=client, backend=args.backend, memory_mb=512, network=network).terminate()

            create(True)  # a microVM template of each kind, built once
            create(None)
            rows["create (and terminate)"] = (timed(lambda: create(True), args.creates),
                                              timed(lambda: create(None), args.creates), "no network")  # fmt: skip
            sbx = Sandbox.create(client=client, backend=args.backend, memory_mb=1024, network=NetworkPolicy())
            try:
                sbx.start_process(["python3", "-c", COUNTER, "8000"])
                url = sbx.expose_port(8000)
                wait_for(url)
                net = SandboxNet(paths.runtime.name, sbx.id)
                rows["GET through an exposed port"] = (timed(lambda: NO_PROXY.open(url, timeout=30).read(),
                                                             args.rounds),
                                                       timed(lambda: direct_get(net, 8000), args.rounds),
                                                       "straight to the namespace")  # fmt: skip
                sealed = Sandbox.create(client=client, backend=args.backend, memory_mb=512)
                try:
                    sealed.start_process(["python3", "-c", COUNTER, "8000"])
                    sealed_url = sealed.expose_port(8000)
                    wait_for(sealed_url)
                    rows["GET, no network (through the agent)"] = (
                        timed(lambda: NO_PROXY.open(sealed_url, timeout=30).read(), args.rounds),
                        rows["GET through an exposed port"][1],
                        "straight to the namespace",
                    )
                finally:
                    sealed.terminate()
                big = f"http://{web.address}/bytes/{args.megabytes << 20}"
                inside = [float(sbx.run(["python3", "-c", DOWNLOAD, big], timeout=600).stdout) for _ in range(3)]
                host = [float(subprocess.run([sys.executable, "-c", DOWNLOAD, big], capture_output=True, text=True,
                                             check=True).stdout) for _ in range(3)]  # fmt: skip
                rows[f"download {args.megabytes} MB"] = (inside, host, "on the host")
            finally:
                sbx.terminate()
                client.close()
    finally:
        for host in hosts.values():
            host.down()
    report = report_ratios(f"networked sandboxes ({args.backend})", f"network-{args.backend}", rows,
                           {"backend": args.backend, "rounds": args.rounds, "megabytes": args.megabytes})  # fmt: skip
    download = report[f"download {args.megabytes} MB"]
    download |= {
        "stasis_MBps": args.megabytes / download["stasis_s"],
        "host_MBps": args.megabytes / download["baseline_s"],
    }
    write_results(f"network-{args.backend}", report)


if __name__ == "__main__":
    main()
