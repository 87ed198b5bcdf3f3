"""The E2B face's cost: the official e2b SDK through `stasis e2b serve` beside stasis' own SDK, same daemon.

    python benchmarks/e2b_face.py [--rounds 20] [--creates 5] [--backend gvisor]

Rows (medians): create → first command (`Sandbox.create()` + `commands.run("true")`, then kill, beside
`stasis.Sandbox.create(image="e2b-base")` + `run`); and a command's round trip on a running sandbox (E2B runs
`/bin/bash -l -c CMD`, so the stasis row runs the same argv); and code-interpreter-v1's create → first `run_code`
(`e2b_code_interpreter.Sandbox`), cold (from its image: the kernel starts on the first call) and warm (from the
template `stasis e2b serve` makes: the kernel already running), each beside stasis' SDK doing the same from the
same image or template. Goal: within 1.2x. Writes benchmarks/results/e2b-BACKEND.json.
"""

from __future__ import annotations

import argparse
import contextlib

from common import Comparison, e2b_listening, report_ratios, serving_daemon, timed
from e2b import Sandbox as E2bSandbox
from e2b_code_interpreter import Sandbox as E2bCodeSandbox

from stasis import Client, NotFound, Sandbox, Template
from stasis.e2b_wire import code_template_name
from stasis.sdk import e2b

MEMORY_MB = 1024  # what `stasis e2b serve` gives a sandbox by default: a kernel and pandas fit


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
        rows = measure(client, args) | measure_code(client, args)
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


def measure_code(client: Client, args: argparse.Namespace) -> dict[str, Comparison]:
    """code-interpreter-v1, cold then warm: the face starts it from its warm template whenever that exists."""
    template = code_template_name(args.backend)

    def e2b_code() -> None:
        sbx = E2bCodeSandbox.create()
        assert sbx.run_code("1 + 1").text == "2"
        sbx.kill()

    def stasis_code(**source: str) -> None:
        sbx = Sandbox.create(backend=args.backend, memory_mb=MEMORY_MB, client=client, **source)
        assert sbx.run_code("1 + 1").text == "2"
        sbx.terminate()

    e2b.code_image(client)
    with contextlib.suppress(NotFound):
        Template.delete(template, client=client)
    e2b_code(), stasis_code(image=e2b.CODE_IMAGE)  # warm the paths (image caches, imports)
    cold = (timed(e2b_code, args.creates), timed(lambda: stasis_code(image=e2b.CODE_IMAGE), args.creates))
    e2b.code_template(args.backend, client)
    e2b_code(), stasis_code(template=template)
    warm = (timed(e2b_code, args.creates), timed(lambda: stasis_code(template=template), args.creates))
    return {
        "code-interpreter create → first run_code, cold": (*cold, "stasis SDK, the same image"),
        "code-interpreter create → first run_code, warm": (*warm, "stasis SDK, the same template"),
    }


if __name__ == "__main__":
    main()
