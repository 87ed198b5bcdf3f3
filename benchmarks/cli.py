"""What a person waits for at the prompt: `stasis ls` and `stasis run NAME true`, as whole processes.

    python benchmarks/cli.py [--rounds 20] [--backend gvisor]

Each row is a fresh process, as typed at a shell, against one daemon with one running sandbox. The
baseline is curl sending the same HTTP request over the same unix socket: what any client must pay
for the daemon's answer (and, for `run`, the command in the sandbox). The `full CLI` rows force the Typer
path that every other command takes (it imports the SDK, pydantic and httpx), to show what the quick path
saves. Goal: ≤ 150 ms for `stasis ls` and for the client side of `stasis run`. Writes
benchmarks/results/cli-BACKEND.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from common import Comparison, report_ratios, serving_daemon, timed

from stasis import Client, Sandbox

FULL_CLI = "import sys; from stasis.cli.commands import main; sys.argv[0] = 'stasis'; main()"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    with serving_daemon("stasis-bench-cli-") as paths, Client(paths) as client:
        sbx = Sandbox.create("bench-cli", backend=args.backend, memory_mb=256, client=client)
        try:
            env = {**os.environ, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
            rows = measure(str(paths.socket), env, args.rounds)
        finally:
            sbx.terminate()
    report_ratios(f"stasis CLI start to finish ({args.backend})", f"cli-{args.backend}", rows, {"rounds": args.rounds})


def measure(socket: str, env: dict[str, str], rounds: int) -> dict[str, Comparison]:
    def process(*argv: str) -> None:
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)

    stasis = [sys.executable, "-m", "stasis"]
    full = [sys.executable, "-c", FULL_CLI]
    curl = ["curl", "-sf", "--unix-socket", socket]
    exec_body = json.dumps({"cmd": ["true"], "env": {}})
    curl_ls = [*curl, "http://stasis/v1/sandboxes"]
    curl_run = [*curl, "-H", "content-type: application/json", "-d", exec_body]
    curl_run.append("http://stasis/v1/sandboxes/bench-cli/exec/stream")
    for argv in (curl_ls, curl_run, [*stasis, "ls"], [*stasis, "run", "bench-cli", "true"]):
        process(*argv)  # warm the page cache and the sandbox's exec path
    return {
        "stasis ls": (timed(lambda: process(*stasis, "ls"), rounds), timed(lambda: process(*curl_ls), rounds), "curl"),
        "stasis run NAME true": (
            timed(lambda: process(*stasis, "run", "bench-cli", "true"), rounds),
            timed(lambda: process(*curl_run), rounds),
            "curl",
        ),
        "full CLI: stasis ls": (
            timed(lambda: process(*full, "ls"), rounds),
            timed(lambda: process(*curl_ls), rounds),
            "curl",
        ),
        "full CLI: stasis run NAME true": (
            timed(lambda: process(*full, "run", "bench-cli", "true"), rounds),
            timed(lambda: process(*curl_run), rounds),
            "curl",
        ),
    }


if __name__ == "__main__":
    main()
