"""Density and daemon scale: host memory per idle sandbox, and a daemon with many sandboxes.

    python benchmarks/density.py [--idle 8] [--idle-microvm 3] [--suspended 200] [--records 10000]

1. Host memory of an idle running sandbox per backend: ``--idle`` sandboxes (256 MiB limit) started,
   left alone for 5 s, then the proportional set size (PSS: shared pages split between sharers) of
   every host process of each (runsc's sandbox and gofer, QEMU), summed. From it: how many idle
   sandboxes fit in 20 GiB.
2. The daemon at scale: one running sandbox ("probe") measured alone (the baseline), then again with
   ``--suspended`` real suspended gVisor sandboxes and ``--records`` terminated records in its store:
   a page of the list (100), the whole list, the probe's exec round trip, and a daemon restart
   (start → health answers and the probe, re-adopted, answers an exec).
Writes benchmarks/results/density.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from common import Comparison, report_ratios, serving_daemon, timed, write_results
from rich.console import Console
from rich.table import Table

from stasis import Client, Sandbox
from stasis.daemon.rooms.host_usage import host_usage
from stasis.paths import Paths, default_home

GIB20_MB = 20 * 1024


def idle_memory(client: Client, backend: str, count: int) -> list[float]:
    with ThreadPoolExecutor(2) as workers:
        boxes = list(workers.map(lambda _: Sandbox.create(client=client, backend=backend, memory_mb=256,
                                                          timeout_secs=None), range(count)))  # fmt: skip
    try:
        for sbx in boxes:
            sbx.run(["true"])
        time.sleep(5)
        return [host_usage(sbx.id)[1] for sbx in boxes]
    finally:
        with ThreadPoolExecutor(4) as workers:
            list(workers.map(lambda s: s.terminate(), boxes))


class Restartable:
    """`stasis serve` on a home, stopped (SIGTERM) and started again by this script."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Seconds until health answers."""
        env = {**os.environ, "STASIS_HOME": str(self.paths.home), "STASIS_IMAGE_DIR": str(self.paths.images)}
        started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "stasis", "serve"], env=env, stderr=subprocess.DEVNULL)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.paths.socket))) as http:
            while True:
                try:
                    http.get("http://stasis/v1/health").raise_for_status()
                    return time.perf_counter() - started
                except httpx.TransportError:
                    time.sleep(0.02)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)


def measure(client: Client, probe: Sandbox, rounds: int) -> dict[str, list[float]]:
    return {
        "list, one page (100)": timed(lambda: Sandbox.list(client=client, limit=100), rounds),
        "list, all live": timed(lambda: Sandbox.list(client=client), rounds),
        "exec round trip (probe)": timed(lambda: probe.run(["true"]), rounds),
    }


def restart(daemon: Restartable, probe_id: str) -> float:
    """Start → health answers and the probe, re-adopted, runs a command."""
    daemon.stop()
    started = time.perf_counter()
    daemon.start()
    with Client(daemon.paths) as client:
        Sandbox.connect(probe_id, client=client).run(["true"])
    return time.perf_counter() - started


def add_records(database: Path, count: int, image_key: str) -> None:
    """Terminated sandboxes as a long-lived daemon accumulates them (written while the daemon is stopped)."""
    db = sqlite3.connect(database)
    now = time.time()
    rows = [(f"sb-r{n:011d}", "terminated", json.dumps({"image": "default"}), now - count + n, image_key)
            for n in range(count)]  # fmt: skip
    with db:
        db.executemany(
            "INSERT INTO sandboxes (id, status, spec, created_at, updated_at, last_activity, image_key) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(i, s, spec, t, t, t, k) for i, s, spec, t, k in rows],
        )
    db.close()


def daemon_scale(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="stasis-bench-scale-"))
    images = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    paths = Paths(home=root / "home", images=images)
    paths.ensure()
    daemon = Restartable(paths)
    daemon.start()
    try:
        with Client(paths) as client:
            probe = Sandbox.create("probe", client=client, memory_mb=256, timeout_secs=None)
            alone = measure(client, probe, args.rounds)
            alone_restart = [restart(daemon, probe.id) for _ in range(3)]
        with Client(paths) as client:

            def suspended(_: int) -> None:
                sbx = Sandbox.create(client=client, memory_mb=256, timeout_secs=None)
                sbx.suspend()

            with ThreadPoolExecutor(2) as workers:
                list(workers.map(suspended, range(args.suspended)))
            image_key = Sandbox.connect("probe", client=client).info().image_key or ""
        daemon.stop()
        add_records(paths.database, args.records, image_key)
        daemon.start()
        with Client(paths) as client:
            probe = Sandbox.connect("probe", client=client)
            crowded = measure(client, probe, args.rounds)
            crowded_restart = [restart(daemon, probe.id) for _ in range(3)]
        rows: dict[str, Comparison] = {op: (crowded[op], alone[op], "one sandbox in the daemon") for op in crowded}
        rows["daemon restart → probe answers"] = (crowded_restart, alone_restart, "one sandbox in the daemon")
        report: dict[str, Any] = {"suspended": args.suspended, "records": args.records}
        return report_ratios(
            f"daemon with {args.suspended} suspended sandboxes and {args.records} records",
            "density-scale",
            rows,
            report,
        )
    finally:
        with Client(paths) as client:
            infos = Sandbox.list(client=client)
            with ThreadPoolExecutor(4) as workers:
                list(workers.map(lambda i: Sandbox(i, client).terminate(), infos))
        daemon.stop()
        shutil.rmtree(paths.runtime, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=8, help="idle gVisor sandboxes measured")
    parser.add_argument("--idle-microvm", type=int, default=3, help="idle microVMs measured")
    parser.add_argument("--suspended", type=int, default=200)
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    memory: dict[str, Any] = {}
    with serving_daemon("stasis-bench-density-") as paths, Client(paths) as client:
        for backend, count in (("gvisor", args.idle), ("microvm", args.idle_microvm)):
            if count:
                samples = idle_memory(client, backend, count)
                median = statistics.median(samples)
                fit = int(GIB20_MB // median)
                memory[backend] = {"sandboxes": count, "host_mb_median": median, "fit_in_20gib": fit}
    table = Table(title="host memory of an idle sandbox (PSS of its host processes), medians", header_style="bold")
    for column in ("backend", "sandboxes measured", "host memory", "idle sandboxes in 20 GiB"):
        table.add_column(column, justify="right")
    for backend, row in memory.items():
        table.add_row(backend, str(row["sandboxes"]), f"{row['host_mb_median']:.1f} MiB", str(row["fit_in_20gib"]))
    if memory:
        Console(width=120).print(table)
        write_results("density-memory", memory)
    if args.suspended:
        daemon_scale(args)


if __name__ == "__main__":
    main()
