"""`stasis shell` keeps what a person types while it connects, as ssh does: the real client on a real pseudo-terminal,
against a stand-in for the daemon's terminal route that opens only once the typing is done (a loaded daemon)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pexpect
import pytest
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection, unix_serve

pytestmark = pytest.mark.fast

CLIENT = "from stasis.paths import Paths; from stasis.shell import attach; print(attach(Paths.from_env(), 'box'))"


def test_what_is_typed_while_stasis_shell_connects_reaches_the_sandbox(tmp_path: Path) -> None:
    typed = threading.Event()
    received = bytearray()

    def opening(connection: ServerConnection, request: Request) -> Response | None:
        typed.wait(60)  # the terminal opens after the person typed: a slow daemon, a slow sandbox
        return None

    def terminal(connection: ServerConnection) -> None:
        for message in connection:
            received.extend(message if isinstance(message, bytes) else b"")
            if received.endswith(b"\n"):
                connection.send(b"the sandbox read: " + bytes(received).strip() + b"\r\n")
                connection.close(reason="the terminal's program ended")
                return

    with unix_serve(terminal, str(tmp_path / "stasis.sock"), process_request=opening) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        env = {**os.environ, "STASIS_HOME": str(tmp_path)}
        term = pexpect.spawn(sys.executable, ["-c", CLIENT], env=env, dimensions=(24, 80), timeout=60)
        try:
            term.send("python3 -q\r")  # typed at once, as the test of the tmux REPL does after the first line
            typed.set()
            term.expect("the sandbox read: python3 -q")
            term.expect(pexpect.EOF)
        finally:
            term.close(force=True)
            server.shutdown()
