"""Suspend/resume soak: one sandbox holding live data, suspended and resumed N times, nothing lost.

    .venv/bin/python benchmarks/cycles.py [--cycles 1000] [--backend gvisor] [--hold-mb 20]

The sandbox holds ``--hold-mb`` MiB of random bytes in a running process (with their
sha256), a counter that ticks, and a file. After every resume the process must be the
same pid with the same hash, the counter must have moved on from where it was, and the
file must be intact; any difference is a loss. Prints median and p99 per cycle (and
per suspend, per resume) and writes benchmarks/results/cycles.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from pathlib import Path

from common import serving_daemon
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from stasis import Client, Sandbox

RESULTS = Path(__file__).parent / "results"
console = Console(width=120)
HOLDER = """
import hashlib, os, sys, time
data = os.urandom({mb} << 20)
open('/root/hash', 'w').write(hashlib.sha256(data).hexdigest())
n = 0
while True:
    n += 1
    open('/root/count.tmp', 'w').write(str(n)); os.replace('/root/count.tmp', '/root/count')
    time.sleep(0.02)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--backend", default="gvisor")
    parser.add_argument("--hold-mb", type=int, default=20)
    args = parser.parse_args()
    marker = hashlib.sha256(b"marker").hexdigest().encode() * 1000
    cycles, suspends, resumes, losses = [], [], [], []
    with serving_daemon("stasis-cycles-") as paths, Client(paths=paths) as client:
        sbx = Sandbox.create("soak", backend=args.backend, memory_mb=512, timeout_secs=86400, client=client)
        try:
            sbx.write_file("/root/marker", marker)
            holder = sbx.start_process(["python3", "-c", HOLDER.format(mb=args.hold_mb)])
            while sbx.run("test -s /root/hash && test -s /root/count").exit_code:
                time.sleep(0.05)
            expected_hash = sbx.read_file("/root/hash")
            with Progress(console=console) as progress:
                task = progress.add_task(f"{args.cycles} suspend/resume cycles", total=args.cycles)
                for n in range(args.cycles):
                    before = int(sbx.read_file("/root/count"))
                    started = time.perf_counter()
                    sbx.suspend()
                    middle = time.perf_counter()
                    sbx.resume()
                    ended = time.perf_counter()
                    suspends.append(middle - started)
                    resumes.append(ended - middle)
                    cycles.append(ended - started)
                    # `kill -0`, not `ps`: under runsc 20240729 each /proc walk between checkpoints leaves state
                    # behind that makes every later checkpoint slower (README: Performance), not what this measures.
                    alive = sbx.run(f"kill -0 {holder.pid}").exit_code == 0
                    if not alive or sbx.read_file("/root/hash") != expected_hash:
                        losses.append(f"cycle {n}: the holder process or its data is gone")
                    if sbx.read_file("/root/marker") != marker:
                        losses.append(f"cycle {n}: the file changed")
                    deadline = time.monotonic() + 10
                    while int(sbx.read_file("/root/count")) <= before:
                        if time.monotonic() > deadline:
                            losses.append(f"cycle {n}: the counter did not move on from {before}")
                            break
                        time.sleep(0.01)
                    progress.advance(task)
        finally:
            sbx.terminate()
    report = {
        "backend": args.backend, "cycles": args.cycles, "hold_mb": args.hold_mb, "losses": losses,
        "cycle_median_seconds": statistics.median(cycles), "cycle_p99_seconds": percentile(cycles, 0.99),
        "suspend_median_seconds": statistics.median(suspends), "suspend_p99_seconds": percentile(suspends, 0.99),
        "resume_median_seconds": statistics.median(resumes), "resume_p99_seconds": percentile(resumes, 0.99),
    }  # fmt: skip
    table = Table(
        title=f"{args.cycles} suspend/resume cycles, {args.backend}, {args.hold_mb} MiB live", header_style="bold"
    )
    for column in ("", "median", "p99"):
        table.add_column(column, justify="right")
    for name in ("cycle", "suspend", "resume"):
        table.add_row(
            name, f"{report[f'{name}_median_seconds'] * 1000:.0f} ms", f"{report[f'{name}_p99_seconds'] * 1000:.0f} ms"
        )
    console.print(table)
    console.print(f"losses: {len(losses)}" + (f" (first: {losses[0]})" if losses else ""))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cycles.json").write_text(json.dumps(report, indent=2))
    console.print(f"wrote {RESULTS / 'cycles.json'}")


if __name__ == "__main__":
    main()
