"""The fleet's cost: its front door beside a node's daemon reached directly, and creates on 2 nodes beside 1.

    python benchmarks/fleet.py [--rounds 100] [--creates 8] [--backend gvisor]

Rows (medians): a sandbox's info and a command's round trip (`run("true")`) through the front door, beside the
same call straight to the node's daemon (goal: the door adds at most 5 ms); and a batch of concurrent creates
(seconds per sandbox, `--creates` at once, then removed) on a `stasis fleet local --nodes 2` beside `--nodes 1`.
Each fleet is a real Ray cluster on this machine. Writes benchmarks/results/fleet-BACKEND.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
from common import Comparison, report_ratios, timed

from stasis import Client, Sandbox

MEMORY_MB = 256


@contextlib.contextmanager
def local_fleet(nodes: int) -> Iterator[tuple[str, str]]:
    """`stasis fleet local --nodes N` in a home of its own: (the door's URL, its token); stopped after."""
    with tempfile.TemporaryDirectory(prefix="stasis-bench-fleet-") as home:
        process = subprocess.Popen(
            [sys.executable, "-m", "stasis", "fleet", "local", "--nodes", str(nodes), "--home", home],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != "STASIS_FLEET"},
        )  # fmt: skip
        exports: dict[str, str] = {}
        assert process.stdout is not None
        for line in process.stdout:
            if match := re.match(r"export (\w+)=(\S+)", line):
                exports[match.group(1)] = match.group(2)
            if {"STASIS_FLEET", "STASIS_TOKEN"} <= set(exports):
                break
        try:
            yield exports["STASIS_FLEET"], exports["STASIS_TOKEN"]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=600)


def creates(client: Client, count: int, backend: str) -> list[float]:
    """Seconds per sandbox of ``count`` concurrent creates (each removed after)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        made = list(pool.map(lambda _: Sandbox.create(memory_mb=MEMORY_MB, backend=backend, client=client),
                             range(count)))  # fmt: skip
    per_sandbox = (time.perf_counter() - started) / count
    for sbx in made:
        sbx.terminate()
    return [per_sandbox]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--creates", type=int, default=8)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    rows: dict[str, Comparison] = {}
    with local_fleet(1) as (url, token):
        one_node = [creates(Client(url=url, token=token), args.creates, args.backend)[0] for _ in range(3)]
    with local_fleet(2) as (url, token):
        door = Client(url=url, token=token)
        node_url = httpx.get(f"{url}/v1/fleet/nodes", headers={"authorization": f"Bearer {token}"}).json()[0]["url"]
        direct = Client(url=node_url, token=token)
        sbx = Sandbox.create(memory_mb=MEMORY_MB, backend=args.backend, node="n1", client=door)
        same = Sandbox.connect(sbx.id, client=direct)
        try:
            sbx.run("true"), same.run("true")
            rows["a sandbox's info"] = (timed(sbx.info, args.rounds), timed(same.info, args.rounds), "its daemon")
            rows["run true"] = (timed(lambda: sbx.run("true"), args.rounds),
                                timed(lambda: same.run("true"), args.rounds), "its daemon")  # fmt: skip
        finally:
            sbx.terminate()
        two_nodes = [creates(door, args.creates, args.backend)[0] for _ in range(3)]
    rows[f"create, {args.creates} at once (per sandbox)"] = (two_nodes, one_node, "one node")
    report = {"rounds": args.rounds, "creates": args.creates, "goal": "the door adds <= 5 ms a call"}
    report_ratios(f"the fleet's front door and 2 nodes ({args.backend})", f"fleet-{args.backend}", rows, report)


if __name__ == "__main__":
    main()
