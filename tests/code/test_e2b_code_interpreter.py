"""E2B's code interpreter SDKs, unchanged, against stasis: `e2b-code-interpreter` (PyPI) and `@e2b/code-interpreter`
(npm) through `stasis e2b serve`. Their template, code-interpreter-v1, is stasis' code-interpreter image as E2B's
`user` in /home/user, started warm; their /execute and /contexts calls on port 49999 reach the same kernel server
as `Sandbox.run_code` (gVisor)."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import zipfile
from base64 import urlsafe_b64encode
from collections.abc import Iterator
from hashlib import sha256
from pathlib import Path

import pytest
from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import BarChart, ChartType

from stasis import Sandbox as StasisSandbox
from tests.conftest import Daemon
from tests.e2b.test_python_sdk import Listener

JS = Path(__file__).parents[1] / "e2b" / "js"


@pytest.fixture(scope="module")
def listener(daemon: Daemon) -> Iterator[Listener]:
    """`stasis e2b serve` makes code-interpreter-v1's image (E2B's user) and its warm template once."""
    served = Listener(daemon, "gvisor", memory_mb=1024)
    yield served
    served.close()


def probe_wheel() -> bytes:
    """A wheel made here (no index reached): the package `stasis_probe`, whose VALUE is 42."""
    files = {"stasis_probe/__init__.py": b"VALUE = 42\n",
             "stasis_probe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: stasis-probe\nVersion: 1.0\n",
             "stasis_probe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                 b"Tag: py3-none-any\n"}  # fmt: skip
    record = [f"{path},sha256={urlsafe_b64encode(sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
              for path, data in files.items()] + ["stasis_probe-1.0.dist-info/RECORD,,"]  # fmt: skip
    files["stasis_probe-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
    return buffer.getvalue()


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
        bars = sbx.run_code(
            "fig, ax = plt.subplots()\nax.bar(['mon', 'tue'], [3, 5])\nax.set_title('visits')\nplt.show()"
        )
        [chart] = [r.chart for r in bars.results if r.chart is not None]  # E2B's chart, beside the png
        assert isinstance(chart, BarChart) and chart.type == ChartType.BAR and chart.title == "visits"
        assert [(e.label, float(e.value)) for e in chart.elements] == [("mon", 3.0), ("tue", 5.0)]
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
        assert "template-start" in {p.name for p in same.list_processes()}  # warm: from its template
        sbx.beta_pause()
        assert Sandbox.connect(sbx.sandbox_id, **options).run_code("x + 1").text == "21"  # resumed, state kept
    finally:
        sbx.kill()


def test_e2b_cookbook_flows_run_as_on_e2b(listener: Listener) -> None:
    """E2B's cookbook, unchanged in what it assumes: the kernel runs as `user` in /home/user, a data set uploaded
    there is read with pandas and fitted with scikit-learn, `!pip install` works (a wheel made here, no
    index), and so does `!sudo` (gVisor: the agent's sudo, setuid not working there)."""
    options = {"api_key": listener.exports["E2B_API_KEY"], "api_url": listener.exports["E2B_API_URL"],
               "sandbox_url": listener.exports["E2B_SANDBOX_URL"]}  # fmt: skip
    sbx = Sandbox.create(**options)
    try:
        assert sbx.run_code("import os, getpass; (os.getcwd(), getpass.getuser())").text == "('/home/user', 'user')"
        rows = "\n".join(f"{x},{2 * x + 1}" for x in range(20))
        sbx.files.write("/home/user/dataset.csv", "x,y\n" + rows + "\n")  # the upload-a-dataset example's path
        fitted = sbx.run_code(
            "import pandas as pd\nfrom sklearn.linear_model import LinearRegression\n"
            "df = pd.read_csv('/home/user/dataset.csv')\nmodel = LinearRegression().fit(df[['x']], df['y'])\n"
            "round(float(model.coef_[0]), 3), round(float(model.intercept_), 3)"
        )
        assert (fitted.error, fitted.text) == (None, "(2.0, 1.0)")
        assert sbx.run_code("import seaborn, plotly; 'ok'").text == "'ok'"
        sbx.files.write("/home/user/stasis_probe-1.0-py3-none-any.whl", probe_wheel())
        installed = sbx.run_code("!pip install --no-index /home/user/stasis_probe-1.0-py3-none-any.whl")
        assert installed.error is None, installed.logs
        assert sbx.run_code("import stasis_probe; stasis_probe.VALUE").text == "42"
        assert "".join(sbx.run_code("!sudo -n whoami").logs.stdout).split() == ["root"]  # a pty: root\r\n
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
