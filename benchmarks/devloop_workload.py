"""An agent's dev loop, phase by phase: run the same on the host and in a sandbox (benchmarks/devloop.py).

    python3 devloop_workload.py WORKDIR INPUTS

INPUTS holds wheels (pytest and its dependencies, six) and a real project's source tree (``project/``: pip's
sdist, unpacked). Prints {phase: seconds} as JSON. Standard library only: it runs on the sandbox's python3.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "init.defaultBranch=main"]


def main() -> None:
    work, inputs = Path(sys.argv[1]), Path(sys.argv[2])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    timings: dict[str, float] = {}

    def phase(name: str, *commands: list[str], cwd: Path = work) -> None:
        started = time.perf_counter()
        for command in commands:
            done = subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
        timings[name] = time.perf_counter() - started

    venv = work / "venv"
    phase("venv", [sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    phase(
        "pip install (local wheels)",
        [python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(inputs / "wheels"), "pytest", "six"],
    )
    project = work / "project"
    shutil.copytree(inputs / "project", project, symlinks=True)
    phase("git init + add + commit", [*GIT, "init", "-q"], [*GIT, "add", "-A"], [*GIT, "commit", "-q", "-m", "import"],
          cwd=project)  # fmt: skip
    tests = work / "tests"
    tests.mkdir()
    shutil.copy(inputs / "test_six.py", tests / "test_six.py")
    phase("pytest (six's suite)", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)])
    target = next(project.rglob("*.py"))
    started = time.perf_counter()
    for round_ in range(5):
        with target.open("a") as f:
            f.write(f"\n# edit {round_}\n")
        for command in (["status", "--short"], ["diff"], ["commit", "-q", "-am", f"edit {round_}"]):
            subprocess.run([*GIT, *command], cwd=project, check=True, stdout=subprocess.DEVNULL)
    timings["edit → status → diff → commit (x5)"] = time.perf_counter() - started
    timings["the whole loop"] = sum(timings.values())
    print(json.dumps(timings))
    os.sync()


if __name__ == "__main__":
    main()
