"""The E2B face's cost: the official e2b SDK through `stasis e2b serve` beside stasis' own SDK, same daemon.

    python benchmarks/e2b_face.py [--rounds 20] [--creates 5] [--backend gvisor]

Rows (medians): create → first command (`Sandbox.create()` + `commands.run("true")`, then kill, beside
`stasis.Sandbox.create(image="e2b-base")` + `run`); and a command's round trip on a running sandbox (E2B runs
`/bin/bash -l -c CMD`, so the stasis row runs the same argv). Goal: within 1.2x. Writes
benchmarks/results/e2b-BACKEND.json.
"""

from __future__ import annotations

import argparse

from common import Comparison, e2b_listening, report_ratios, serving_daemon, timed
from e2b import Sandbox as E2bSandbox

from stasis import Client, Sandbox
from stasis.sdk import e2b

MEMORY_MB = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    with (
        serving_daemon("stasis-bench-e2b-") as paths,
        Client(paths) as client,
        e2b_listening(client, args.backend, MEMORY_MB),
    ):
        rows = measure(client, args)
    report_ratios(f"E2B SDK vs stasis SDK ({args.backend})", f"e2b-{args.backend}", rows, {"rounds": args.rounds})


def measure(client: Client, args: argparse.Namespace) -> dict[str, Comparison]:
    def e2b_create_run() -> None:
        sbx = E2bSandbox.create()
        sbx.commands.run("true")
        sbx.kill()

    def stasis_create_run() -> None:
        sbx = Sandbox.create(image=e2b.BASE_IMAGE, backend=args.backend, memory_mb=MEMORY_MB, client=client)
        sbx.run(["/bin/bash", "-l", "-c", "true"])
        sbx.terminate()

    e2b_create_run(), stasis_create_run()  # warm both paths (image caches, imports)
    creates = (timed(e2b_create_run, args.creates), timed(stasis_create_run, args.creates), "stasis SDK")
    theirs = E2bSandbox.create(timeout=1800)
    ours = Sandbox.connect(theirs.sandbox_id, client=client)  # the very same sandbox, through either door
    try:
        theirs.commands.run("true"), ours.run(["true"])
        round_trip = (
            timed(lambda: theirs.commands.run("true"), args.rounds),
            timed(lambda: ours.run(["/bin/bash", "-l", "-c", "true"]), args.rounds),
            "stasis SDK, the same sandbox",
        )
    finally:
        theirs.kill()
    return {"create → first command": creates, "a command's round trip": round_trip}


if __name__ == "__main__":
    main()
