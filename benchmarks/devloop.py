"""An agent's dev loop in a sandbox beside the bare host, in one run (issue 30's yardstick).

    python benchmarks/devloop.py [--rounds 3] [--backends gvisor,gvisor:fast]

The loop (benchmarks/devloop_workload.py): a venv; `pip install` of pytest and six from local wheels; a real
project imported into git and committed (pip's own sdist, ~1,000 files); six's test suite under pytest; five
rounds of edit → `git status` → `git diff` → `git commit`. Its inputs come from PyPI once (on the host, into
build/devloop-inputs). The host runs it on a disk made like a gVisor sandbox's own (benchmarks/fs.py's), a
sandbox in its /root. Each phase's median beside the host's; goal (issue 30): the whole loop ≤ 1.2x, every git
phase ≤ 2x. Writes benchmarks/results/devloop.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from common import report_ratios, serving_daemon
from fs import host_disk

from stasis import Client, Sandbox

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ROOT / "build" / "devloop-inputs"
WORKLOAD = Path(__file__).with_name("devloop_workload.py")
WHEELS = ("pytest==8.3.4", "iniconfig==2.0.0", "packaging==24.2", "pluggy==1.5.0", "six==1.17.0")
PROJECT = "pip==24.3.1"


def inputs() -> Path:
    """Wheels, pip's source tree and six's tests, fetched once."""
    if (INPUTS / "ready").exists():
        return INPUTS
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    subprocess.run([*pip, "--only-binary", ":all:", "-d", str(INPUTS / "wheels"), *WHEELS], check=True)
    sdists = INPUTS / "sdists"
    subprocess.run([*pip, "--no-binary", ":all:", "-d", str(sdists), PROJECT, "six==1.17.0"], check=True)
    for archive in sdists.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            tar.extractall(sdists, filter="data")
    (INPUTS / "project").symlink_to(next(p for p in sdists.iterdir() if p.name.startswith("pip-") and p.is_dir()))
    six = next(p for p in sdists.iterdir() if p.name.startswith("six-") and p.is_dir())
    (INPUTS / "test_six.py").write_bytes((six / "test_six.py").read_bytes())
    (INPUTS / "ready").touch()
    return INPUTS


def on_host(where: Path, given: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(WORKLOAD), str(where / "loop"), str(given)], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout)


def in_sandbox(sbx: Sandbox) -> dict[str, float]:
    done = sbx.run(["python3", "/root/devloop_workload.py", "/root/loop", "/root/inputs"], timeout=3600)
    if done.exit_code != 0:
        raise RuntimeError(f"the loop failed in {sbx.id}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="gvisor")
    args = parser.parse_args()
    given = inputs()
    host: list[dict[str, float]] = []
    with host_disk(4096) as disk:
        for _ in range(args.rounds):
            host.append(on_host(disk, given))
    report: dict = {"rounds": args.rounds}
    with serving_daemon("stasis-bench-devloop-") as paths, Client(paths) as client:
        for name in args.backends.split(","):
            backend, _, storage = name.partition(":")  # gvisor:fast: fast storage
            sbx = Sandbox.create(
                backend=backend, memory_mb=2048, disk_mb=8192, storage=storage or "durable", client=client
            )
            try:
                sbx.upload_dir((given / "wheels").resolve(), "/root/inputs/wheels")
                sbx.upload_dir((given / "project").resolve(), "/root/inputs/project")
                sbx.write_file("/root/inputs/test_six.py", (given / "test_six.py").read_bytes())
                sbx.write_file("/root/devloop_workload.py", WORKLOAD.read_bytes())
                ours = [in_sandbox(sbx) for _ in range(args.rounds)]
            finally:
                sbx.terminate()
            rows = {phase: ([r[phase] for r in ours], [h[phase] for h in host], "bare host") for phase in host[0]}
            report[name] = report_ratios(f"dev loop ({name})", f"devloop-{name.replace(':', '-')}", rows, {})
            report[name]["medians"] = {p: statistics.median(r[p] for r in ours) for p in host[0]}


if __name__ == "__main__":
    main()
