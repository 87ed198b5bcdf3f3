"""The verbs a person reaches for, through the real CLI process and the real daemon: start, logs, kill, ps, cp,
checkpoints ls, daemon status|stop|restart."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stasis import Sandbox
from tests.conftest import Daemon, wait_until


@pytest.fixture(scope="module")
def box(daemon: Daemon) -> Iterator[Sandbox]:
    sbx = Sandbox.create("verbs", memory_mb=256, client=daemon.client())
    yield sbx
    sbx.terminate()


def stasis(daemon: Daemon, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stasis", *args], env=daemon.env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)  # fmt: skip


def test_a_named_background_process_is_started_followed_listed_and_killed(daemon: Daemon, box: Sandbox) -> None:
    ticker = "import time\nfor i in range(3): print('tick', i); time.sleep(0.2)\ntime.sleep(600)"
    started = stasis(daemon, "start", "--name", "web", "verbs", "--", "python3", "-c", ticker)
    assert started.returncode == 0 and "started web" in started.stdout, started.stderr
    # follow_output works without -u: a started Python writes unbuffered
    wait_until(lambda: "tick 2" in stasis(daemon, "logs", "verbs", "web").stdout, timeout=60)
    assert "web" in stasis(daemon, "ps", "verbs").stdout
    assert stasis(daemon, "kill", "verbs", "web", "--signal", "SIGKILL").returncode == 0
    wait_until(lambda: "web" not in stasis(daemon, "ps", "verbs").stdout, timeout=60)  # running ones only
    assert "web" in stasis(daemon, "ps", "--all", "verbs").stdout


def test_cp_copies_files_and_directories_both_ways(daemon: Daemon, box: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "deep.txt").write_text("deep")
    (tmp_path / "one.bin").write_bytes(bytes(range(256)) * 100)
    assert stasis(daemon, "cp", str(tmp_path / "one.bin"), "verbs:/root/one.bin").returncode == 0
    assert stasis(daemon, "cp", str(tmp_path / "tree"), "verbs:/root/tree").returncode == 0
    assert box.read_file("/root/one.bin") == bytes(range(256)) * 100
    assert box.read_file("/root/tree/sub/deep.txt") == b"deep"
    back = tmp_path / "back"
    back.mkdir()
    assert stasis(daemon, "cp", "verbs:/root/one.bin", str(back)).returncode == 0  # into a directory: its name
    assert (back / "one.bin").read_bytes() == bytes(range(256)) * 100
    assert stasis(daemon, "cp", "verbs:/root/tree", str(back / "tree")).returncode == 0
    assert (back / "tree" / "sub" / "deep.txt").read_text() == "deep"
    missing = stasis(daemon, "cp", "verbs:/root/nope", str(back))
    assert missing.returncode != 0 and "nope" in missing.stderr
    both_local = stasis(daemon, "cp", str(tmp_path / "one.bin"), str(back / "x"))
    assert both_local.returncode != 0 and "NAME:PATH" in both_local.stderr


def test_checkpoints_ls_lists_them(daemon: Daemon, box: Sandbox) -> None:
    checkpoint = box.checkpoint("filesystem", name="verbs-ls")
    try:
        assert "verbs-ls" in stasis(daemon, "checkpoints", "ls").stdout
    finally:
        Sandbox.delete_checkpoint(checkpoint.id, client=daemon.client())


def test_daemon_status_stop_and_restart(own_daemon: Daemon) -> None:
    own_daemon.start()
    sbx = Sandbox.create("kept", memory_mb=256, client=own_daemon.client())
    assert stasis(own_daemon, "daemon", "status").returncode == 0
    assert stasis(own_daemon, "daemon", "stop").returncode == 0
    assert own_daemon.proc is not None and own_daemon.proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn's way
    status = stasis(own_daemon, "daemon", "status")
    assert status.returncode == 1 and "not running" in " ".join(status.stderr.split())
    restarted = stasis(own_daemon, "daemon", "restart")
    assert restarted.returncode == 0, restarted.stderr
    try:
        assert Sandbox.connect("kept", client=own_daemon.client()).run("echo adopted").stdout == "adopted\n"
    finally:
        sbx.terminate()
        stopped = stasis(own_daemon, "daemon", "stop")  # the daemon the CLI started: stopped by the CLI too
        assert stopped.returncode == 0, stopped.stderr


def test_ls_shows_the_backend_and_never_cuts_a_name_or_an_id(daemon: Daemon, box: Sandbox) -> None:
    long_name = "a-sandbox-whose-name-is-long-enough-to-be-cut-at-80-columns"
    sbx = Sandbox.create(long_name, memory_mb=256, client=daemon.client())
    try:
        listing = stasis(daemon, "ls").stdout
        row = next((line for line in listing.splitlines() if line.split()[:1] == [long_name]), listing)
        assert sbx.id in row.split() and "gvisor" in row.split()
        assert stasis(daemon, "ls").stdout.splitlines()[0].split()[:4] == ["NAME", "ID", "STATUS", "BACKEND"]
    finally:
        sbx.terminate()
