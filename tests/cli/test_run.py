"""`stasis run` as a person uses it, like `ssh host cmd`: the real CLI process against the real daemon."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from stasis import Client, Sandbox
from tests.conftest import Daemon, wait_until


@pytest.fixture(scope="module")
def box(daemon: Daemon) -> Iterator[Sandbox]:
    sbx = Sandbox.create("run-cli", memory_mb=256, client=daemon.client())
    yield sbx
    sbx.terminate()


def stasis(daemon: Daemon, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "stasis", *args], env=daemon.env, capture_output=True,
                          input=stdin if stdin is not None else b"", timeout=300)  # fmt: skip


def test_piped_stdin_goes_to_the_command_binary_safe_with_its_end(daemon: Daemon, box: Sandbox) -> None:
    assert stasis(daemon, "run", "run-cli", "--", "cat", stdin=b"hello\n").stdout == b"hello\n"
    lines = "".join(f"{i}\n" for i in range(1, 1001)).encode()
    assert stasis(daemon, "run", "run-cli", "--", "wc", "-l", stdin=lines).stdout.strip() == b"1000"
    blob = os.urandom(3 << 20)
    digest = stasis(daemon, "run", "run-cli", "--", "sha256sum", stdin=blob).stdout.split()[0]
    assert digest.decode() == hashlib.sha256(blob).hexdigest()
    assert stasis(daemon, "run", "-n", "run-cli", "--", "cat", stdin=b"not sent").stdout == b""  # as ssh -n


def test_one_string_runs_through_the_shell_as_the_sdk_does_and_argv_stays_argv(daemon: Daemon, box: Sandbox) -> None:
    shell = stasis(daemon, "run", "run-cli", "echo $HOME | tr a-z A-Z")
    assert shell.stdout == b"/ROOT\n", shell.stderr
    assert stasis(daemon, "run", "run-cli", "--", "echo $HOME | tr a-z A-Z").stdout == b"/ROOT\n"
    assert stasis(daemon, "run", "run-cli", "python3", "-c", "print(6 * 7)").stdout == b"42\n"  # no `--` needed
    verbatim = stasis(daemon, "run", "run-cli", "--", "echo", "$HOME", "a|b")
    assert verbatim.stdout == b"$HOME a|b\n", verbatim.stderr  # argv: verbatim
    assert stasis(daemon, "run", "run-cli", "no-such-command --flag").returncode == 127  # as the shell says
    misplaced = stasis(daemon, "run", "run-cli", "--timeout", "5", "--", "true")
    assert misplaced.returncode != 0 and b"options go before the sandbox's name" in b" ".join(misplaced.stderr.split())
    assert box.run("no-such-command --flag").exit_code == 127  # the SDK: the same


@pytest.mark.parametrize(("sent", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_stasis_run_ends_the_remote_process_tree(
    daemon: Daemon, box: Sandbox, sent: signal.Signals, code: int
) -> None:
    marker, child = f"sleep-{code}", f"sleep {400 + code}"  # its own: not an earlier test's leftover
    argv = [sys.executable, "-m", "stasis", "run", "-n", "run-cli", f"sh -c '{child}; echo {marker}'"]
    cli = subprocess.Popen(argv, env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: child in box.run("ps -eo args").stdout, timeout=60)
        cli.send_signal(sent)
        assert cli.wait(timeout=60) == code
        assert b"killed" in cli.stderr.read() if cli.stderr else False
        wait_until(lambda: child not in box.run("ps -eo args").stdout, timeout=60)  # its child too
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def test_detach_leaves_the_command_running_on_purpose(daemon: Daemon, box: Sandbox, client: Client) -> None:
    started = stasis(daemon, "run", "--detach", "run-cli", "--", "sleep", "300")
    assert started.returncode == 0 and b"started" in started.stdout
    process_id = started.stdout.split()[1].decode()
    assert Sandbox.connect("run-cli", client=client).get_process(process_id).status == "running"
    box.kill_process(process_id)


def test_fifty_megabytes_through_a_slow_reader_arrive_byte_exact(daemon: Daemon, box: Sandbox) -> None:
    """The reader (this test) drains the CLI's stdout slowly: the command waits for it, as under ssh, and not a
    byte is lost (an agent that kept only its last 8 MiB used to drop the rest, with exit code 0)."""
    size = 50_000_000
    cli = subprocess.Popen([sys.executable, "-m", "stasis", "run", "-n", "run-cli", f"yes | head -c {size}"],
                           env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert cli.stdout is not None
    digest, received = hashlib.sha256(), 0
    while piece := cli.stdout.read(1 << 20):
        digest.update(piece)
        received += len(piece)
        time.sleep(0.05)  # a terminal, a slow disk: the pipe stays full for a while each time
    assert cli.wait(timeout=300) == 0, cli.stderr.read() if cli.stderr else ""
    assert received == size
    assert digest.hexdigest() == hashlib.sha256(b"y\n" * (size // 2)).hexdigest()


@pytest.mark.parametrize("args", [("ls",), ("run", "run-cli", "true")], ids=["ls", "run"])
def test_ls_and_run_answer_without_loading_the_sdk(daemon: Daemon, box: Sandbox, args: tuple[str, ...]) -> None:
    """The two commands typed all day take the quick path: no pydantic, httpx, Typer or Rich at start-up
    (benchmarks/cli.py measures what that saves)."""
    argv = [sys.executable, "-X", "importtime", "-m", "stasis", *args]
    done = subprocess.run(argv, env=daemon.env, capture_output=True, stdin=subprocess.DEVNULL, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.decode().splitlines() if "|" in line}
    assert "stasis.cli.quick" in imported
    heavy = {m for m in imported if m.split(".")[0] in ("pydantic", "httpx", "typer", "rich")}
    assert not heavy | {m for m in imported if m.startswith(("stasis.sdk", "stasis.models"))}
