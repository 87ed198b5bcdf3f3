"""E2B's Template builds through `stasis e2b serve`: a rebuild with only its last step changed beside the full build.

    python benchmarks/templates.py [--rounds 3] [--backend gvisor]

The template (the official e2b SDK's ``Template``): COPY a folder of 200 files, a venv made (a few seconds of real
work), its files compiled, ENV, WORKDIR, then a last RUN. Each round builds it from a context of its own (nothing
cached: the full build), then again with only the last RUN changed (every step before it from the cache), and
starts a sandbox from each. Goal: the rebuild within 20% of the full build. Writes benchmarks/results/templates.json.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from common import e2b_listening, report_ratios, serving_daemon, timed
from e2b import Sandbox, Template

from stasis import Client

FILES = 200


def template(context: Path, last: str) -> Template:
    return (
        Template(file_context_path=str(context))
        .from_base_image()
        .copy("app", "/home/user/app")
        .run_cmd("python3 -m venv /home/user/venv && /home/user/venv/bin/python -m pip --version")
        .run_cmd("python3 -m compileall -q /home/user/app")
        .set_envs({"APP_MODE": "bench"})
        .set_workdir("/home/user/app")
        .run_cmd(last)
    )


def context(root: Path) -> Path:
    (root / "app").mkdir(parents=True)
    for i in range(FILES):
        (root / "app" / f"module_{i}.py").write_text(f"VALUE = {i}\nRUN = {uuid.uuid4().hex!r}\n" + "x = 1\n" * 50)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="gvisor")
    args = parser.parse_args()
    full, rebuilt = [], []
    with (
        serving_daemon("stasis-bench-templates-") as paths,
        Client(paths) as client,
        e2b_listening(client, args.backend, 1024),
        tempfile.TemporaryDirectory() as scratch,
    ):
        for round_number in range(args.rounds):
            root = context(Path(scratch) / str(round_number))
            name = f"bench-{uuid.uuid4().hex[:8]}"
            full += timed(lambda: Template.build(template(root, "echo one > last.txt"), f"{name}:v1"), 1)
            rebuilt += timed(lambda: Template.build(template(root, "echo two > last.txt"), f"{name}:v2"), 1)
            sbx = Sandbox.create(f"{name}:v2")
            assert sbx.files.read("/home/user/app/last.txt") == "two\n"
            sbx.kill()
    rows = {"rebuild, only the last step changed": (rebuilt, full, "the full build")}
    report_ratios("E2B Template builds", "templates", rows, {"rounds": args.rounds, "files": FILES})


if __name__ == "__main__":
    main()
