"""Keystroke echo latency through the terminal path, beside a local pseudo-terminal.

    .venv/bin/python benchmarks/shell.py [--keys N]

stasis: a byte sent over the WebSocket to a `cat -u`-like raw echo on a PTY in the sandbox,
timed until its echo comes back. Local: the same program on a PTY on the host (os.openpty).
Prints median and p99 and writes benchmarks/results/shell.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import signal
import statistics
import time
import tty
from pathlib import Path

from common import serving_daemon
from rich.console import Console
from rich.table import Table
from websockets.sync.client import unix_connect

from stasis import Client, Sandbox
from stasis.paths import Paths

console = Console(width=120)
# Raw mode, then echo every byte back: what a shell's line editor does per keystroke.
ECHO = ["python3", "-c", "import os, tty; tty.setraw(0)\nwhile True: os.write(1, os.read(0, 1))"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def local_echo(keys: int) -> list[float]:
    pid, master = pty.fork()
    if pid == 0:
        os.execvp(ECHO[0], ECHO)
    tty.setraw(master)
    time.sleep(0.5)
    samples = []
    for _ in range(keys):
        started = time.perf_counter()
        os.write(master, b"x")
        select.select([master], [], [], 5)
        os.read(master, 1024)
        samples.append(time.perf_counter() - started)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return samples


def sandbox_echo(paths: Paths, sandbox_id: str, keys: int) -> list[float]:
    path = f"/v1/sandboxes/{sandbox_id}/pty?cols=80&rows=24&cmd=" + json.dumps(ECHO).replace(" ", "%20")
    samples = []
    with unix_connect(str(paths.socket), "ws://stasis" + path.replace("\n", "%0A")) as ws:
        time.sleep(1.0)
        while True:  # drain anything printed at start
            try:
                ws.recv(timeout=0.3)
            except TimeoutError:
                break
        for _ in range(keys):
            started = time.perf_counter()
            ws.send(b"x")
            ws.recv(timeout=10)
            samples.append(time.perf_counter() - started)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=300)
    args = parser.parse_args()
    with serving_daemon("stasis-bench-shell-") as paths:
        client = Client(paths)
        sbx = Sandbox.create(memory_mb=256, client=client)
        ours = sandbox_echo(paths, sbx.id, args.keys)
        local = local_echo(args.keys)
        sbx.terminate()
        client.close()
    report = {
        "keys": args.keys,
        "stasis_median_ms": statistics.median(ours) * 1000,
        "stasis_p99_ms": percentile(ours, 0.99) * 1000,
        "local_pty_median_ms": statistics.median(local) * 1000,
        "local_pty_p99_ms": percentile(local, 0.99) * 1000,
    }
    table = Table(title=f"keystroke echo, {args.keys} keys", header_style="bold")
    for column in ("path", "median", "p99"):
        table.add_column(column, justify="left" if column == "path" else "right")
    table.add_row("stasis: WebSocket → daemon → agent → PTY in gVisor", f"{report['stasis_median_ms']:.2f} ms",
                  f"{report['stasis_p99_ms']:.2f} ms")  # fmt: skip
    table.add_row(
        "local PTY on the host", f"{report['local_pty_median_ms']:.3f} ms", f"{report['local_pty_p99_ms']:.3f} ms"
    )
    console.print(table)
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "shell.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {results / 'shell.json'}")


if __name__ == "__main__":
    main()
