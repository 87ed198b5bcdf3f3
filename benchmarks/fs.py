"""File-system work in a sandbox beside the bare host, in one run (issue 14's yardstick).

The same script (benchmarks/fs_workload.py: SQLite in WAL + synchronous=NORMAL and in DELETE +
synchronous=FULL mode, ~20k small files written, tarred, untarred and committed to git, 256 MiB
written with fsync and read) runs on this host, on a disk made like a gVisor sandbox's own (a loop-mounted
sparse ext4 file, same options), and in a fresh sandbox of each backend, in /root (its own disk).
Each phase's median is compared with the host's.

    python benchmarks/fs.py [--rounds 3] [--backends gvisor,gvisor:fast,microvm] [--scale 1.0]

(A microVM on TCG runs the guest's CPU work emulated: its ratios say more about TCG than about I/O.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from common import report_ratios, serving_daemon

from stasis import Client, Sandbox
from stasis.backends.gvisor import disk

WORKLOAD = Path(__file__).with_name("fs_workload.py")


@contextlib.contextmanager
def host_disk(size_mb: int) -> Iterator[Path]:
    """A disk like a gVisor sandbox's own (a sparse ext4 file, loop-mounted with the same options), so the
    baseline differs from the sandbox only by the sandbox's kernel, not by the host file system under it."""
    with tempfile.TemporaryDirectory(prefix="stasis-bench-fs-") as scratch:
        image, mountpoint = Path(scratch) / "disk.ext4", Path(scratch) / "disk"
        asyncio.run(disk.create(image, size_mb))
        asyncio.run(disk.attach(image, mountpoint))
        try:
            yield mountpoint
        finally:
            disk.detach(mountpoint)


def on_host(where: Path, scale: float) -> dict[str, float]:
    out = subprocess.run([sys.executable, str(WORKLOAD), f"{where}/work", str(scale)], check=True,
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
    with serving_daemon("stasis-bench-fs-") as paths, host_disk(8192) as scratch:
        client = Client(paths)
        for name in args.backends.split(","):
            backend, _, storage = name.partition(":")  # gvisor:fast: fast storage
            sandbox = Sandbox.create(
                client=client, backend=backend, memory_mb=2048, disk_mb=8192, storage=storage or "durable"
            )
            try:
                sandbox.write_file("/root/fs_workload.py", WORKLOAD.read_bytes())
                host: list[dict[str, float]] = []
                ours: list[dict[str, float]] = []
                for _ in range(args.rounds):  # side by side, round by round: the noise hits both
                    host.append(on_host(scratch, args.scale))
                    ours.append(in_sandbox(sandbox, args.scale))
            finally:
                sandbox.terminate()
            baseline = "the host, same disk"
            rows = {phase: ([r[phase] for r in ours], [r[phase] for r in host], baseline) for phase in host[0]}
            rows["all of it"] = ([sum(r.values()) for r in ours], [sum(r.values()) for r in host], baseline)
            report = {"rounds": args.rounds, "scale": args.scale, "backend": backend,
                      "host_total_s": statistics.median(sum(r.values()) for r in host)}  # fmt: skip
            report_ratios(f"file systems ({name})", f"fs-{name.replace(':', '-')}", rows, report)
        client.close()


if __name__ == "__main__":
    main()
