"""File-system work in a sandbox beside the bare host, in one run (issue 14's yardstick).

The same script (benchmarks/fs_workload.py: SQLite in WAL + synchronous=NORMAL and in DELETE +
synchronous=FULL mode, ~20k small files written, tarred, untarred and committed to git, 256 MiB
written with fsync and read) runs on this host in a temporary directory and in a fresh sandbox of
each backend, in /root (the sandbox's own disk). Each phase's median is compared with the host's.

    python benchmarks/fs.py [--rounds 3] [--backends gvisor,microvm] [--scale 1.0]

(A microVM on TCG runs the guest's CPU work emulated: its ratios say more about TCG than about I/O.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import report_ratios, serving_daemon

from stasis import Client, Sandbox

WORKLOAD = Path(__file__).with_name("fs_workload.py")


def on_host(scale: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="stasis-bench-fs-") as scratch:
        out = subprocess.run([sys.executable, str(WORKLOAD), f"{scratch}/work", str(scale)], check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    return json.loads(out)


def in_sandbox(sandbox: Sandbox, scale: float) -> dict[str, float]:
    result = sandbox.run(["python3", "/root/fs_workload.py", "/root/bench", str(scale)], timeout=3600)
    if result.exit_code != 0:
        raise RuntimeError(f"the workload failed in {sandbox.id}: {result.stderr}")
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="gvisor,microvm")
    parser.add_argument("--scale", type=float, default=1.0, help="work per phase (1.0: the sizes above)")
    args = parser.parse_args()
    with serving_daemon("stasis-bench-fs-") as paths:
        client = Client(paths)
        for backend in args.backends.split(","):
            sandbox = Sandbox.create(client=client, backend=backend, memory_mb=2048, disk_mb=8192)
            try:
                sandbox.write_file("/root/fs_workload.py", WORKLOAD.read_bytes())
                host: list[dict[str, float]] = []
                ours: list[dict[str, float]] = []
                for _ in range(args.rounds):  # side by side, round by round: the noise hits both
                    host.append(on_host(args.scale))
                    ours.append(in_sandbox(sandbox, args.scale))
            finally:
                sandbox.terminate()
            rows = {phase: ([r[phase] for r in ours], [r[phase] for r in host], "the bare host") for phase in host[0]}
            rows["all of it"] = ([sum(r.values()) for r in ours], [sum(r.values()) for r in host], "the bare host")
            report = {"rounds": args.rounds, "scale": args.scale, "backend": backend,
                      "host_total_s": statistics.median(sum(r.values()) for r in host)}  # fmt: skip
            report_ratios(f"file systems ({backend})", f"fs-{backend}", rows, report)
        client.close()


if __name__ == "__main__":
    main()
