"""The official `e2b` npm package (pinned in tests/e2b/js/package.json), unchanged, with node's own test runner,
against `stasis e2b serve` on each backend."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2b.test_python_sdk import Listener, listener  # noqa: F401 (the fixture: one listener per backend)

JS = Path(__file__).parent / "js"
JS_TESTS = (JS / "sdk.test.mjs").read_text().count("\ntest(")


def test_the_js_sdk_runs_unchanged(listener: Listener) -> None:  # noqa: F811
    if shutil.which("node") is None or not (JS / "node_modules" / "e2b").is_dir():
        pytest.fail("node and tests/e2b/js/node_modules are missing: `make setup` installs them (npm ci)")
    env = {**listener.env, **listener.exports, "STASIS_TEST_BACKEND": listener.backend}
    run = subprocess.run(["node", "--test", "--test-reporter=spec", "sdk.test.mjs"], cwd=JS, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    summary = dict(re.findall(r"^\S+ (pass|fail) (\d+)$", run.stdout, re.MULTILINE))
    assert summary == {"pass": str(JS_TESTS), "fail": "0"}, run.stdout[-4000:]  # every test ran, none failed
