"""`stasis shell` through a real pseudo-terminal: a REPL survives detach, suspend and resume."""

from __future__ import annotations

import sys

import pexpect

from stasis import Sandbox, SandboxStatus
from tests.conftest import Daemon


def attach(daemon: Daemon, name: str) -> pexpect.spawn:
    return pexpect.spawn(
        sys.executable, ["-m", "stasis", "shell", name], env=daemon.env, dimensions=(30, 100), timeout=180
    )


def test_repl_in_tmux_survives_detach_suspend_resume(daemon: Daemon) -> None:
    with daemon.client() as client:
        sbx = Sandbox.create("shelly", memory_mb=512, client=client)
        term = attach(daemon, "shelly")
        term.expect("shelly")  # "attached to shelly": typed at once, before tmux is up, as a person may
        term.send("python3 -q\r")  # (it was lost whenever the terminal took longer than pexpect's 50 ms to open)
        term.expect(">>> ")
        term.send("x = 6 * 7; history = 'typed before the suspend'\r")
        term.expect(">>> ")
        term.send("\x1c")  # Ctrl-\ detaches
        term.expect("detached")
        term.expect(pexpect.EOF)

        sbx.suspend()
        assert sbx.info().status == SandboxStatus.SUSPENDED
        sbx.resume()

        term = attach(daemon, "shelly")
        term.expect("typed before the suspend")  # the screen comes back with its history
        term.send("print(x, history)\r")
        term.expect("42 typed before the suspend")
        term.send("\x1c")
        term.expect(pexpect.EOF)
        sbx.terminate()


def test_shell_on_an_unknown_sandbox_is_a_clear_error(daemon: Daemon) -> None:
    term = attach(daemon, "nobody")
    term.expect("no sandbox named or with id 'nobody'")
    term.expect(pexpect.EOF)
