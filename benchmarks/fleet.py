"""The fleet's cost: its front door beside a node's daemon reached directly, and creates on 2 nodes beside 1.

    python benchmarks/fleet.py [--rounds 100] [--creates 8] [--backend gvisor]

Rows (medians): a sandbox's info and a command's round trip (`run("true")`) through the front door, beside the
same call straight to the node's daemon (goal: the door adds at most 5 ms); a batch of concurrent creates and a
fork of `--creates` children (seconds per sandbox) on a `stasis fleet local --nodes 2` beside `--nodes 1`; a move
to the other node beside a suspend and resume on one; and a host's loss: from `kill-node` to an idle sandbox
answering on the other node, beside a resume from that node's own disk. Each fleet is a real Ray cluster on this
machine. Writes benchmarks/results/fleet-BACKEND.json.
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
from pathlib import Path

import httpx
from common import Comparison, report_ratios, timed

from stasis import Client, Sandbox

MEMORY_MB = 256


@contextlib.contextmanager
def local_fleet(nodes: int) -> Iterator[tuple[str, str, Path]]:
    """`stasis fleet local --nodes N` in a home of its own: (the door's URL, its token, the home); stopped after."""
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
            yield exports["STASIS_FLEET"], exports["STASIS_TOKEN"], Path(home)
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


def forks(client: Client, count: int, backend: str) -> float:
    """Seconds per child of a live fork into ``count`` (removed after)."""
    parent = Sandbox.create(memory_mb=MEMORY_MB, backend=backend, client=client)
    started = time.perf_counter()
    children = parent.copy(times=count)
    per_child = (time.perf_counter() - started) / count
    for sbx in [*children, parent]:
        sbx.terminate()
    return per_child


def moves(client: Client, backend: str) -> tuple[list[float], list[float]]:
    """A move to the other node, and (the baseline) a suspend and resume where it is, three of each."""
    sbx = Sandbox.create("bench-mover", memory_mb=MEMORY_MB, backend=backend, client=client)
    try:
        sbx.run("true")
        moved = timed(lambda: sbx.move(), 3)
        stayed = timed(lambda: (sbx.suspend(), sbx.resume()), 3)
    finally:
        sbx.terminate()
    return moved, stayed


def host_loss(url: str, token: str, home: Path, client: Client, backend: str) -> tuple[list[float], list[float]]:
    """From `kill-node` to an idle sandbox of that node answering on the other, beside a resume from disk."""
    here = Sandbox.create("bench-here", memory_mb=MEMORY_MB, backend=backend, node="n1", client=client)
    here.suspend()
    local = timed(lambda: (here.run("true"), here.suspend()), 3)
    here.terminate()
    idle = Sandbox.create("bench-idle", memory_mb=MEMORY_MB, backend=backend, node="n2", timeout_secs=1, client=client)
    deadline = time.monotonic() + 300
    while not (home / "store" / "sandboxes" / f"{idle.id}.json").exists():  # idle, suspended, sent to the store
        if time.monotonic() > deadline:
            raise TimeoutError("the idle sandbox never reached the fleet's store")
        time.sleep(0.5)
    headers = {"authorization": f"Bearer {token}"}
    started = time.perf_counter()
    httpx.delete(f"{url}/v1/fleet/nodes/n2", headers=headers, timeout=300).raise_for_status()
    idle.run("true")
    lost = [time.perf_counter() - started]
    idle.terminate()
    return lost, local


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--creates", type=int, default=8)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    rows: dict[str, Comparison] = {}
    with local_fleet(1) as (url, token, _):
        one = Client(url=url, token=token)
        one_node = [creates(one, args.creates, args.backend)[0] for _ in range(3)]
        one_node_forks = [forks(one, args.creates, args.backend) for _ in range(3)]
    with local_fleet(2) as (url, token, home):
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
        two_node_forks = [forks(door, args.creates, args.backend) for _ in range(3)]
        moved, stayed = moves(door, args.backend)
        lost, local = host_loss(url, token, home, door, args.backend)
    rows[f"create, {args.creates} at once (per sandbox)"] = (two_nodes, one_node, "one node")
    rows[f"fork into {args.creates} (per child)"] = (two_node_forks, one_node_forks, "one node")
    rows["move to the other node"] = (moved, stayed, "suspend + resume, one node")
    rows["host loss: kill-node to answering elsewhere"] = (lost, local, "resume from its own disk")
    report = {"rounds": args.rounds, "creates": args.creates, "goal": "the door adds <= 5 ms a call"}
    report_ratios(f"the fleet's front door and 2 nodes ({args.backend})", f"fleet-{args.backend}", rows, report)


if __name__ == "__main__":
    main()
