"""run_code: Jupyter kernels in the sandbox (the code-interpreter image) whose state lives as long as the sandbox:
across suspends, an idle suspend and its auto-resume, a daemon SIGKILL, MEMORY checkpoint forks and a move
through the remote store. What the kernel server answers is the server's, not the backend's: those tests share
one gVisor sandbox; the kernel's life through the backend's own work (suspend, resume, an idle suspend) is tested on
both backends, and what the daemon does around it (a SIGKILL, forks of a MEMORY checkpoint) on gVisor."""

from __future__ import annotations

import base64
from collections.abc import Iterator

import pytest

from stasis import Client, Execution, NotFound, Sandbox, SandboxStatus, Template, Unsupported
from stasis.sdk.template import interpreter_template
from tests.conftest import Daemon, wait_until
from tests.remote.conftest import nodes, s3  # noqa: F401 - fixtures: two daemons on one S3 store

MEMORY_MB = 1024  # pandas and matplotlib in a kernel want a few hundred MiB


@pytest.fixture(scope="module")
def box(daemon: Daemon) -> Iterator[Sandbox]:
    sbx = Sandbox.create(image="code-interpreter", memory_mb=MEMORY_MB, backend="gvisor", client=daemon.client())
    yield sbx
    sbx.terminate()


def loaded(sbx: Sandbox) -> None:
    """State worth keeping: a variable, an imported module, a fitted model of sorts."""
    done = sbx.run_code("import numpy as np\nrows = np.arange(1_000_000)\nmodel = {'mean': float(rows.mean())}")
    assert done.error is None, done.error


def still_loaded(sbx: Sandbox) -> Execution:
    return sbx.run_code("(int(rows.sum()), model['mean'], np.__name__)")


KEPT = "(499999500000, 499999.5, 'numpy')"


def test_values_output_and_rich_results_come_back_as_a_notebook_shows_them(box: Sandbox) -> None:
    heard: list[str] = []
    first = box.run_code("x = 40\nprint('hello')\nx + 2", on_stdout=heard.append)
    assert (first.text, first.logs.stdout, heard, first.error) == ("42", ["hello\n"], ["hello\n"], None)
    assert box.run_code("import sys; print('warn', file=sys.stderr)").logs.stderr == ["warn\n"]

    plot = box.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')")
    image = next(r.image() for r in plot.results if r.image())  # no savefig: the figure is a display
    assert image[0] == "png" and image[1].startswith(b"\x89PNG\r\n\x1a\n")
    table = box.run_code("import pandas as pd\npd.DataFrame({'city': ['Oslo', 'Lima'], 'n': [1, 2]})")
    assert "<table" in table.results[0].html and "Oslo" in table.results[0].html and table.text is not None

    failed = box.run_code("def f():\n    return 1 / 0\nf()")
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("ZeroDivisionError",
                                                                                    "division by zero")  # fmt: skip
    assert "return 1 / 0" in failed.error.traceback and "\x1b[" not in failed.error.traceback
    assert box.run_code("x").text == "40"  # an error leaves the kernel as it was
    env = box.run_code("import os; os.environ.get('ONLY_HERE')", envs={"ONLY_HERE": "yes"})
    assert env.text == "'yes'" and box.run_code("os.environ.get('ONLY_HERE')").text is None


def test_a_timeout_interrupts_the_kernel_and_the_next_execution_answers(box: Sandbox) -> None:
    box.run_code("kept = 'before the loop'")
    stuck = box.run_code("while True: pass", timeout=3)
    assert stuck.error is not None and stuck.error.name == "TimeoutError"
    assert box.run_code("kept").text == "'before the loop'"


def test_a_bash_kernel_keeps_its_shell_state(box: Sandbox) -> None:
    """bash_kernel (from PyPI, installed into the image): variables and the working directory stay."""
    shell = box.create_code_context(language="bash", cwd="/tmp")
    try:
        box.run_code("export GREETING=hello; cd /root", context=shell)
        assert box.run_code("echo $GREETING from $(pwd)", context=shell).logs.stdout == ["hello from /root\n"]
        assert box.run_code("echo $((6 * 7))", language="bash").logs.stdout == ["42\n"]  # bash's default context
    finally:
        box.remove_code_context(shell)


def test_contexts_are_kernels_of_their_own(box: Sandbox) -> None:
    context = box.create_code_context(cwd="/tmp")
    assert context.id in {c.id for c in box.list_code_contexts()}
    box.run_code("mine = 1", context=context)
    assert box.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
    assert box.run_code("'mine' in dir()").text == "False"  # the default context does not see it
    box.restart_code_context(context)
    assert box.run_code("'mine' in dir()", context=context).text == "False"
    box.remove_code_context(context)
    assert context.id not in {c.id for c in box.list_code_contexts()}
    with pytest.raises(NotFound, match="no context"):
        box.run_code("1", context=context)


def test_a_kernel_that_dies_mid_run_is_an_error_and_its_context_goes_on_with_a_new_one(box: Sandbox) -> None:
    context = box.create_code_context()
    try:
        box.run_code("doomed = 1", context=context)
        died = box.run_code("import os, signal; print('before'); os.kill(os.getpid(), signal.SIGKILL)", context=context)
        assert died.error is not None and died.error.name == "KernelDied", died  # an answer, not a wait forever
        assert "restarted" in died.error.value
        assert box.run_code("'doomed' in dir()", context=context).text == "False"
        assert box.run_code("6 * 7", context=context).text == "42"
    finally:
        box.remove_code_context(context)


def test_the_kernel_lives_through_suspend_resume_and_an_idle_suspend(daemon: Daemon, backend: str) -> None:
    client = daemon.client()
    sbx = Sandbox.create("kernel-idle", image="code-interpreter", memory_mb=MEMORY_MB, backend=backend,
                         timeout_secs=3, client=client)  # fmt: skip
    try:
        loaded(sbx)
        sbx.suspend()
        sbx.resume()
        assert still_loaded(sbx).text == KEPT
        wait_until(lambda: Sandbox.connect("kernel-idle", client=client).status == SandboxStatus.SUSPENDED, 120)
        assert still_loaded(sbx).text == KEPT  # this call resumed it
    finally:
        sbx.terminate()


@pytest.mark.parametrize("backend", ["gvisor"])
def test_the_kernel_survives_a_daemon_sigkill(own_daemon: Daemon, backend: str) -> None:
    own_daemon.start()
    sbx = Sandbox.create(image="code-interpreter", memory_mb=MEMORY_MB, backend=backend, client=own_daemon.client())
    loaded(sbx)
    own_daemon.kill()
    own_daemon.start()
    again = Sandbox.connect(sbx.id, client=own_daemon.client())
    assert still_loaded(again).text == KEPT
    again.terminate()


@pytest.mark.parametrize("backend", ["gvisor"])
def test_forks_of_a_live_analysis_go_their_own_ways(daemon: Daemon, backend: str) -> None:
    client = daemon.client()
    sbx = Sandbox.create(image="code-interpreter", memory_mb=MEMORY_MB, backend=backend, client=client)
    forks: list[Sandbox] = []
    checkpoint = None
    try:
        loaded(sbx)
        checkpoint = sbx.checkpoint("memory")
        forks = [Sandbox.create(snapshot_id=checkpoint.id, client=client) for _ in range(2)]
        forks[0].run_code("model['mean'] += 1")
        forks[1].run_code("model['mean'] = -1.0")
        assert [f.run_code("model['mean']").text for f in forks] == ["500000.5", "-1.0"]
        assert still_loaded(sbx).text == KEPT  # the original is untouched
    finally:
        for made in (*forks, sbx):
            made.terminate()
        if checkpoint is not None:  # the shared daemon's checkpoints are other tests' subject
            Sandbox.delete_checkpoint(checkpoint.id, client=client)


def test_a_first_execution_starts_the_server_and_a_plain_image_says_what_it_needs(client: Client) -> None:
    plain = Sandbox.create(memory_mb=256, client=client)
    try:
        with pytest.raises(Unsupported, match=r"needs Jupyter.*image='code-interpreter'"):
            plain.run_code("1 + 1")
    finally:
        plain.terminate()


def test_a_png_result_is_base64_of_a_png(box: Sandbox) -> None:
    shown = box.run_code("from IPython.display import Image, display\nimport base64\n"
                         "display(Image(data=base64.b64decode("
                         f"'{base64.b64encode(_tiny_png()).decode()}')))")  # fmt: skip
    assert [r.image() for r in shown.results] == [("png", _tiny_png())]


def _tiny_png() -> bytes:
    return base64.b64decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
    )


def test_the_kernel_moves_to_another_node_through_the_remote_store(nodes: tuple[Daemon, Daemon]) -> None:  # noqa: F811
    """Pushed from node A, resumed on node B: the same kernel, its data still loaded (gVisor)."""
    a, b = nodes
    a.start()
    b.start()
    with a.client() as client_a, b.client() as client_b:
        sbx = Sandbox.create("kernel-mover", image="code-interpreter", memory_mb=MEMORY_MB, client=client_a)
        loaded(sbx)
        sbx.push()
        Sandbox.pull("kernel-mover", client=client_b)
        moved = Sandbox.connect("kernel-mover", client=client_b)
        assert moved.id == sbx.id and still_loaded(moved).text == KEPT
        moved.terminate()


def test_a_template_starts_sandboxes_with_a_warm_kernel(client: Client) -> None:
    """`stasis template code-interpreter`: its sandboxes' kernel server and Python kernel already run (gVisor)."""
    template = interpreter_template("code-warm", client=client, memory_mb=MEMORY_MB)
    try:
        sbx = Sandbox.create(template="code-warm", client=client)
        try:
            running = [p.name for p in sbx.list_processes() if p.status == "running"]
            assert "template-start" in running  # the server came with the template's memory: nothing was started
            assert "python" in {c.id for c in sbx.list_code_contexts()}
            assert sbx.run_code("6 * 7").text == "42"
        finally:
            sbx.terminate()
    finally:
        Template.delete(template.name, client=client)
