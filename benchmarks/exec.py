"""Where an exec round trip's time goes, layer by layer, in one gVisor sandbox.

    python benchmarks/exec.py [--rounds 30] [--backend gvisor]

Rows (medians): a daemon call that never reaches the sandbox (info); a guest call that does almost
nothing (stat of /root: the daemon, the agent's FIFO pair and a thread of the agent); `run(["true"])`;
and inside the sandbox, without stasis: `subprocess.run(["true"])`, `os.posix_spawn` + wait, a thread
started and joined, and batches of plain system calls (getppid, stat, open + close), each beside the
same script on the host. The baseline of the stasis rows is `subprocess.run(["true"])` on the host.
Writes benchmarks/results/exec-BACKEND.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import Comparison, report_ratios, serving_daemon, timed

from stasis import Client, Sandbox

INSIDE = r"""
import json, os, subprocess, sys, threading, time
def median(action, rounds):
    action()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return sorted(samples)[len(samples) // 2]
def thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
def batch(action, size=200):
    def run():
        for _ in range(size):
            action()
    return lambda: run()
def open_close():
    os.close(os.open(__file__, os.O_RDONLY))
rounds = int(sys.argv[1])
print(json.dumps({
    "subprocess.run(true)": median(lambda: subprocess.run(["true"]), rounds),
    "posix_spawn(true) + wait": median(
        lambda: os.waitpid(os.posix_spawn("/bin/true", ["true"], dict(os.environ)), 0), rounds),
    "a thread started and joined": median(thread, rounds),
    "200 x getppid()": median(batch(os.getppid), rounds),
    "200 x stat()": median(batch(lambda: os.stat(__file__)), rounds),
    "200 x open() + close()": median(batch(open_close), rounds),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    with serving_daemon("stasis-bench-exec-") as paths, Client(paths) as client:
        sbx = Sandbox.create(client=client, backend=args.backend, memory_mb=512)
        try:
            sbx.write_file("/root/inside.py", INSIDE)
            host = timed(lambda: subprocess.run(["true"]), args.rounds)
            baseline = "subprocess.run(true), host"
            rows: dict[str, Comparison] = {
                "info (daemon only)": (timed(sbx.info, args.rounds), host, baseline),
                "stat /root (a guest call)": (timed(lambda: sbx.stat("/root"), args.rounds), host, baseline),
                "run(['true'])": (timed(lambda: sbx.run(["true"]), args.rounds), host, baseline),
            }
            inside = json.loads(sbx.run(["python3", "/root/inside.py", str(args.rounds)]).stdout)
            with tempfile.TemporaryDirectory(prefix="stasis-bench-exec-") as scratch:
                script = Path(scratch) / "inside.py"
                script.write_text(INSIDE)
                outside = json.loads(subprocess.run([sys.executable, str(script), str(args.rounds)], check=True,
                                                    capture_output=True, text=True).stdout)  # fmt: skip
            for name, seconds in inside.items():
                rows[f"{name}, in the sandbox"] = ([seconds], [outside[name]], "the same on the host")
        finally:
            sbx.terminate()
        report_ratios(f"exec, layer by layer ({args.backend})", f"exec-{args.backend}", rows, {"rounds": args.rounds})


if __name__ == "__main__":
    main()
