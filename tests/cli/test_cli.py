"""The CLI contract other tools script against, run through Typer's runner against the real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from stasis import InvalidRequest, SandboxNotFound
from stasis.backends.microvm.artifacts import find_kernel_release
from stasis.cli import app
from tests.conftest import Daemon, new_home, wait_until


@pytest.fixture
def cli(daemon: Daemon, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("STASIS_HOME", str(daemon.paths.home))
    monkeypatch.setenv("STASIS_IMAGE_DIR", str(daemon.paths.images))
    runner = CliRunner()

    def invoke(*args: str):  # type: ignore[no-untyped-def]
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


def test_create_run_suspend_resume_info_rm(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("create", "cli-box", "--cpus", "1", "--memory-mb", "256")
    assert result.exit_code == 0, result.output
    assert "created cli-box" in result.output

    listed = json.loads(cli("ls", "--json").stdout)
    assert [s["name"] for s in listed] == ["cli-box"]
    assert listed[0]["status"] == "running"

    result = cli("run", "cli-box", "--", "sh", "-c", "echo to-out; echo to-err >&2; exit 5")
    assert result.exit_code == 5
    assert result.stdout == "to-out\n"
    assert result.stderr == "to-err\n"

    assert cli("run", "cli-box", "--", "ls", "-d", "/root").stdout == "/root\n"  # flags after -- are the command's

    assert cli("suspend", "cli-box").exit_code == 0
    info = json.loads(cli("info", "cli-box", "--json").stdout)
    assert info["status"] == "suspended"
    assert info["last_suspend_seconds"] > 0

    assert cli("resume", "cli-box").exit_code == 0
    assert json.loads(cli("info", "cli-box", "--json").stdout)["status"] == "running"
    human = cli("info", "cli-box").stdout
    assert "platform" in human and "running" in human

    assert cli("rm", "cli-box").exit_code == 0
    assert json.loads(cli("ls", "--json").stdout) == []
    with pytest.raises(SandboxNotFound, match="cli-box"):
        cli("rm", "cli-box")
    assert cli("rm", "-f", "cli-box").exit_code == 0  # `docker rm -f` in a script: a name not there is no error
    assert cli("create", "cli-box", "--memory-mb", "256").exit_code == 0
    assert cli("suspend", "cli-box").exit_code == 0
    gone = cli("rm", "--force", "cli-box", "never-made")
    assert gone.exit_code == 0 and "removed cli-box" in gone.output
    assert json.loads(cli("ls", "--json").stdout) == []


def test_a_microvm_runs_its_own_linux_kernel_and_says_how(cli) -> None:  # type: ignore[no-untyped-def]
    result = cli("create", "cli-vm", "--backend", "microvm", "--memory-mb", "256")
    assert result.exit_code == 0, result.output
    kernel = cli("run", "cli-vm", "--", "uname", "-r").stdout.strip()
    assert kernel.endswith("-cloud-amd64"), f"a microVM boots Debian's cloud kernel, not {kernel!r}"
    assert kernel == find_kernel_release()
    human = cli("info", "cli-vm").stdout
    assert "microvm" in human and "accelerator" in human
    assert cli("rm", "cli-vm").exit_code == 0
    with pytest.raises(InvalidRequest, match="backend"):
        cli("create", "cli-nope", "--backend", "firecracker")


def test_run_timeout_exits_124(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("create", "cli-timeout", "--memory-mb", "256").exit_code == 0
    result = cli("run", "--timeout", "0.5", "cli-timeout", "--", "sleep", "30")
    assert result.exit_code == 124
    assert "timed out" in result.stderr
    cli("rm", "cli-timeout")


def test_errors_are_one_clear_line_and_exit_1(daemon: Daemon) -> None:
    env = {**daemon.env}
    result = subprocess.run(
        [sys.executable, "-m", "stasis", "run", "nope", "--", "true"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert result.stderr.startswith("error: no sandbox named or with id 'nope'")
    assert "Traceback" not in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "stasis", "create", "bad/name"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "invalid sandbox name" in result.stderr


def test_image_ls_lists_the_default_image(cli) -> None:  # type: ignore[no-untyped-def]
    images = json.loads(cli("image", "ls", "--json").stdout)
    assert "default" in {i["name"] for i in images}


def test_cli_starts_the_daemon_when_none_runs() -> None:
    daemon = Daemon(new_home("autostart"))
    env = daemon.env
    result = subprocess.run([sys.executable, "-m", "stasis", "ls", "--json"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    pid = int(daemon.paths.pidfile.read_text())
    os.kill(pid, 15)
    wait_until(lambda: not daemon.paths.pidfile.exists())
    assert not daemon.paths.socket.exists()


def test_checkpoint_fork_df_and_create_from(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli("create", "cli-src", "--memory-mb", "256").exit_code == 0
    assert cli("run", "cli-src", "--", "sh", "-c", "echo hello > /root/greeting").exit_code == 0

    result = cli("checkpoint", "cli-src", "--type", "filesystem", "--name", "cli-ckpt")
    assert result.exit_code == 0, result.output
    checkpoint_id = result.stdout.strip()
    assert checkpoint_id.startswith("ck-")

    listed = json.loads(cli("checkpoints", "--json").stdout)  # the shared daemon may hold other tests' templates
    mine = [(c["id"], c["name"], c["type"]) for c in listed if c["sandbox_name"] == "cli-src"]
    assert mine == [(checkpoint_id, "cli-ckpt", "filesystem")]

    assert cli("create", "cli-copy", "--from", "cli-ckpt").exit_code == 0
    assert cli("run", "cli-copy", "--", "cat", "/root/greeting").stdout == "hello\n"

    forked = cli("fork", "cli-src", "--count", "2")
    assert forked.exit_code == 0, forked.output
    names = forked.stdout.split()
    assert len(names) == 2 and all(n.startswith("cli-src-") for n in names)
    assert cli("run", names[0], "--", "cat", "/root/greeting").stdout == "hello\n"

    usage = json.loads(cli("df", "--json").stdout)
    assert usage["checkpoints"][checkpoint_id] > 0
    assert len(usage["sandboxes"]) >= 4 and usage["images_bytes"] > 0

    assert cli("checkpoints", "rm", checkpoint_id).exit_code == 0
    assert checkpoint_id not in {c["id"] for c in json.loads(cli("checkpoints", "--json").stdout)}
    assert cli("rm", "cli-src", "cli-copy", *names).exit_code == 0
