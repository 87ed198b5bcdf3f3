"""E2B's code interpreter SDKs, unchanged, against stasis: `e2b-code-interpreter` (PyPI) and `@e2b/code-interpreter`
(npm) through `stasis e2b serve`. Their template, code-interpreter-v1, is stasis' code-interpreter image; their
/execute and /contexts calls on port 49999 reach the same kernel server as `Sandbox.run_code` (gVisor)."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b_code_interpreter import Sandbox

from stasis import Sandbox as StasisSandbox
from stasis import Template
from stasis.sdk.template import interpreter_template
from tests.conftest import Daemon
from tests.e2b.test_python_sdk import Listener

JS = Path(__file__).parents[1] / "e2b" / "js"


@pytest.fixture(scope="module")
def listener(daemon: Daemon) -> Iterator[Listener]:
    """With the warm template there (`stasis template code-interpreter`), as a user who wants fast starts has it."""
    with daemon.client() as client:
        template = interpreter_template(client=client, replace=True)
    served = Listener(daemon, "gvisor", memory_mb=1024)
    yield served
    served.close()
    with daemon.client() as client:
        Template.delete(template.name, client=client)


def test_the_python_sdk_runs_code_keeps_its_variables_and_gets_rich_results(listener: Listener, daemon: Daemon) -> None:
    options = {"api_key": listener.exports["E2B_API_KEY"], "api_url": listener.exports["E2B_API_URL"],
               "sandbox_url": listener.exports["E2B_SANDBOX_URL"]}  # fmt: skip
    sbx = Sandbox.create(**options)  # template code-interpreter-v1: stasis' code-interpreter image
    try:
        heard: list[str] = []
        first = sbx.run_code("x = 20\nprint('hi')\nx * 2", on_stdout=lambda m: heard.append(m.line))
        assert (first.text, first.logs.stdout, heard, first.error) == ("40", ["hi\n"], ["hi\n"], None)
        plot = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])")
        assert any(r.png and base64.b64decode(r.png).startswith(b"\x89PNG") for r in plot.results)
        sbx.files.write("/tmp/dataset.csv", "day,visits\n2026-01-01,3\n2026-01-02,5\n")  # the cookbook's upload
        table = sbx.run_code("import pandas as pd\ndf = pd.read_csv('/tmp/dataset.csv', parse_dates=['day'])\ndf")
        assert table.results[0].data == {"day": ["2026-01-01T00:00:00", "2026-01-02T00:00:00"], "visits": [3, 5]}
        assert table.results[0].html is not None  # and the table as Jupyter shows it, as before
        failed = sbx.run_code("undefined_name")
        assert failed.error is not None and failed.error.name == "NameError"
        context = sbx.create_code_context(cwd="/tmp")
        assert sbx.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
        assert context.id in {c.id for c in sbx.list_code_contexts()}
        sbx.remove_code_context(context)
        # the same kernel through stasis' own SDK: one server, two doors; warm from the template
        same = StasisSandbox.connect(sbx.sandbox_id, client=daemon.client())
        assert same.run_code("x").text == "20"
        assert "template-start" in {p.name for p in same.list_processes()}
        sbx.beta_pause()
        assert Sandbox.connect(sbx.sandbox_id, **options).run_code("x + 1").text == "21"  # resumed, state kept
    finally:
        sbx.kill()


def test_the_js_sdk_runs_unchanged(listener: Listener) -> None:
    if shutil.which("node") is None or not (JS / "node_modules" / "@e2b" / "code-interpreter").is_dir():
        pytest.fail("node and tests/e2b/js/node_modules are missing: `make setup` installs them (npm ci)")
    env = {**listener.env, **listener.exports}
    run = subprocess.run(["node", "--test", "--test-reporter=spec", "code.test.mjs"], cwd=JS, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-4000:]
    tests = (JS / "code.test.mjs").read_text().count("\ntest(")
    assert dict(re.findall(r"^\S+ (pass|fail) (\d+)$", run.stdout, re.MULTILINE)) == {"pass": str(tests), "fail": "0"}
