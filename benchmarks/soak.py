"""Crash soak: SIGKILL the daemon at random kill points, restart it, check every sandbox.

    .venv/bin/python benchmarks/soak.py [--iterations N] [--seed S]

Each iteration starts a daemon with STASIS_KILL_POINT set to a random point, drives
a sandbox through create → suspend → resume → terminate until the daemon dies,
restarts it without the kill point and checks the invariants: every sandbox is
running, suspended or gone (never half-way), a surviving sandbox still has its
process and files, and no runsc process exists for a sandbox the store does not
run. Prints what it found and writes benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from stasis import Client, DaemonUnavailable, Sandbox, SandboxStatus, faults
from stasis.paths import Paths, default_home

console = Console(width=130)
S = SandboxStatus


def start_daemon(paths: Paths, kill_point: str | None) -> subprocess.Popen:
    env = {**os.environ, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
    env.pop("STASIS_KILL_POINT", None)
    if kill_point:
        env["STASIS_KILL_POINT"] = kill_point
    log = open(paths.home / "soak-daemon.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "stasis", "serve"], env=env, stdout=log, stderr=log)
    log.close()
    transport = httpx.HTTPTransport(uds=str(paths.socket))
    with httpx.Client(transport=transport, base_url="http://stasis") as http:
        for _ in range(1200):
            try:
                http.get("/v1/health", timeout=30)
                return proc
            except httpx.TransportError:
                time.sleep(0.05)
    raise RuntimeError("daemon did not start")


def runsc_sandbox_ids(home: Path) -> set[str]:
    ids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "runsc" in cmdline and str(home) in cmdline:
                ids.update(part[:15] for part in cmdline.split("sandboxes/")[1:])
    return ids


def drive(client: Client) -> None:
    """The workload, until the daemon dies (DaemonUnavailable) or it completes."""
    sbx = Sandbox.create("soak", memory_mb=256, client=client)
    sbx.write_file("/root/keep", b"kept")
    sbx.start_process(["sleep", "100000"], name="sleeper")
    for _ in range(2):
        sbx.suspend()
        sbx.resume()
    sbx.terminate()


def check(client: Client, paths: Paths) -> list[str]:
    problems = []
    live = Sandbox.list(client=client)
    for info in live:
        if info.status not in (S.RUNNING, S.SUSPENDED):
            problems.append(f"{info.name} is {info.status.value} after recovery")
            continue
        sbx = Sandbox(info, client)
        if sbx.read_file("/root/keep") != b"kept":
            problems.append("file lost")
        if not any(p.name == "sleeper" and p.status == "running" for p in sbx.list_processes()):
            problems.append("process lost")
    running = {i.id for i in Sandbox.list(client=client) if i.status == S.RUNNING}
    orphans = runsc_sandbox_ids(paths.home) - running
    if orphans:
        problems.append(f"runsc processes without a running sandbox: {sorted(orphans)}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    image_dir = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    root = Path(tempfile.mkdtemp(prefix="stasis-soak-"))
    outcomes: Counter[str] = Counter()
    failures: list[dict] = []
    try:
        for n in range(args.iterations):
            point = rng.choice(faults.all_points())
            paths = Paths(home=root / f"it-{n}", images=image_dir)
            paths.ensure()
            daemon = start_daemon(paths, point)
            client = Client(paths)
            client.autostart = False
            try:
                drive(client)
                reached = False
            except DaemonUnavailable:
                reached = True
            if reached:
                daemon.wait(timeout=60)
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(timeout=60)
            daemon = start_daemon(paths, None)
            client = Client(paths)
            client.autostart = False
            states = ",".join(sorted(i.status.value for i in Sandbox.list(client=client))) or "gone"
            problems = check(client, paths)  # resumes what it reads: look at the states first
            outcomes[f"{point} → {states}"] += 1
            console.print(
                f"{n + 1:>3} {point:<36} killed={reached!s:<5} after restart: {states:<10} "
                f"{'[green]ok[/green]' if not problems else '[red]' + '; '.join(problems) + '[/red]'}"
            )
            if problems:
                failures.append({"iteration": n, "point": point, "problems": problems})
            for info in Sandbox.list(client=client):
                Sandbox(info, client).terminate()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
            shutil.rmtree(paths.runtime, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title=f"crash soak: {args.iterations} iterations, seed {seed}", header_style="bold")
    table.add_column("kill point → states after recovery")
    table.add_column("times", justify="right")
    for outcome, times in sorted(outcomes.items()):
        table.add_row(outcome, str(times))
    console.print(table)
    console.print(f"{len(failures)} iterations with problems" if failures else "[green]no problems found[/green]")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    report = {"seed": seed, "iterations": args.iterations, "outcomes": dict(outcomes), "failures": failures}
    (results / "soak.json").write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
