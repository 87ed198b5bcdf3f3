"""Streaming output, following a process from an offset, and process control errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from websockets.sync.client import unix_connect

from stasis import Client, InvalidRequest, Sandbox, StateError
from tests.conftest import Daemon, wait_until


@pytest.fixture
def sandbox(shared_sandbox: Sandbox) -> Sandbox:
    """One sandbox per backend for the module: its subject is streams and process control, not a sandbox's life."""
    return shared_sandbox


def test_output_is_streamed_line_by_line_while_the_command_runs(sandbox: Sandbox) -> None:
    arrivals: list[tuple[float, bytes]] = []
    errors: list[bytes] = []
    started = time.monotonic()
    result = sandbox.run(
        "for i in 1 2 3 4 5 6 7 8 9 10; do echo line$i; sleep 0.1; done; echo oops >&2",
        on_stdout=lambda data: arrivals.append((time.monotonic() - started, data)),
        on_stderr=errors.append,
    )
    total = time.monotonic() - started
    assert result.exit_code == 0
    assert result.stdout == "".join(f"line{i}\n" for i in range(1, 11))
    assert b"".join(errors) == b"oops\n" and result.stderr == "oops\n"
    assert len(arrivals) >= 5, "output arrived in one piece at the end"
    assert arrivals[0][0] < total - 0.5, "the first line only arrived at the end"
    assert arrivals[-1][0] - arrivals[0][0] > 0.5


def test_stream_iterator_ends_with_the_exit_event(sandbox: Sandbox) -> None:
    events = list(sandbox.stream("echo a; echo b >&2; exit 3"))
    assert [e.kind for e in events][-1] == "exit"
    assert events[-1].exit_code == 3
    assert b"".join(e.data for e in events if e.kind == "stdout") == b"a\n"
    assert b"".join(e.data for e in events if e.kind == "stderr") == b"b\n"


FOLLOWER = """
import os, sys
from stasis import Client, Sandbox
from stasis.paths import Paths
sbx = Sandbox.connect(sys.argv[1], client=Client())
out = sys.argv[3]
with open(out, "ab") as f:
    for offset, data in sbx.follow_output(sys.argv[2], offset=os.path.getsize(out), wait=1):
        assert offset == f.tell()
        f.write(data)
        f.flush()
"""


def test_follow_output_resumes_across_a_client_kill_and_a_suspend(daemon: Daemon, client: Client, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sbx = Sandbox.create("follower", memory_mb=256, client=client)
    numbers = (
        "import time\nfor i in range(1, 100001):\n    print(i, flush=i % 500 == 0)\n"
        "    if i % 5000 == 0: time.sleep(0.3)"
    )
    proc = sbx.start_process(["python3", "-c", numbers])
    received = tmp_path / "received"
    received.write_bytes(b"")

    first = subprocess.Popen([sys.executable, "-c", FOLLOWER, sbx.id, proc.id, str(received)], env=daemon.env)
    wait_until(lambda: received.stat().st_size > 100_000, timeout=60)
    first.send_signal(signal.SIGKILL)  # a client killed mid-stream
    first.wait()

    sbx.suspend()  # and the sandbox suspended mid-stream
    sbx.resume()

    second = subprocess.Popen([sys.executable, "-c", FOLLOWER, sbx.id, proc.id, str(received)], env=daemon.env)
    assert second.wait(timeout=120) == 0
    lines = received.read_bytes().decode().splitlines()
    assert lines == [str(i) for i in range(1, 100001)], "bytes were lost or repeated"
    sbx.terminate()


def test_process_control_errors_are_clear(daemon: Daemon, sandbox: Sandbox) -> None:
    proc = sandbox.start_process(["sleep", "100"], stdin=True)
    with pytest.raises(InvalidRequest, match="unknown signal 'SIGNOPE'"):
        sandbox.send_signal(proc.id, "SIGNOPE")
    sandbox.send_signal(proc.id, "TERM")
    wait_until(lambda: sandbox.get_process(proc.id).status == "exited")
    with pytest.raises(StateError, match="already exited"):
        sandbox.write_stdin(proc.id, b"too late")

    path = f"/v1/sandboxes/{sandbox.id}/pty?cols=80&rows=24&cmd=" + json.dumps(["cat"])
    with unix_connect(str(daemon.paths.socket), "ws://stasis" + path.replace(" ", "%20")) as ws:
        ws.send(json.dumps({"type": "resize", "cols": 0, "rows": 0}))
        error = json.loads(ws.recv(timeout=10))
        assert error == {"type": "error", "message": "terminal size 0x0 is invalid; columns and rows must be 1-1000"}
        ws.send(b"still alive\r")
        seen = b""
        while b"still alive" not in seen:
            message = ws.recv(timeout=10)
            seen += message if isinstance(message, bytes) else b""
