"""`stasis shell`: the local terminal attached to a pseudo-terminal in the sandbox over a WebSocket."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import termios
import threading
import tty
import urllib.parse
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .paths import Paths
from .wsclient import open_websocket

DETACH = b"\x1c"  # Ctrl-\


def _open(paths: Paths, ref: str, cols: int, rows: int, cmd: list[str] | None) -> ClientConnection:
    query = {"cols": cols, "rows": rows} | ({"cmd": json.dumps(cmd)} if cmd else {})
    return open_websocket(paths, f"/v1/sandboxes/{urllib.parse.quote(ref)}/pty?{urllib.parse.urlencode(query)}")


def attach(paths: Paths, ref: str, cmd: list[str] | None = None) -> str:
    """Attach until the user detaches (Ctrl-\\) or the program ends. Returns why it ended."""
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    cols, rows = os.get_terminal_size(stdout) if os.isatty(stdout) else (80, 24)
    ws = _open(paths, ref, cols, rows, cmd)
    ended = threading.Event()
    reason: list[str] = []

    def screen() -> None:
        try:
            for message in ws:
                if isinstance(message, bytes):
                    os.write(stdout, message)
                else:
                    data: dict[str, Any] = json.loads(message)
                    if data.get("type") == "error":
                        reason.append(data.get("message", "error"))
        except ConnectionClosed as closed:
            if closed.rcvd is not None:
                reason.append(closed.rcvd.reason or "connection closed")
        finally:
            ended.set()

    def resized(*_: object) -> None:
        columns, lines = os.get_terminal_size(stdout)
        with contextlib.suppress(ConnectionClosed):
            ws.send(json.dumps({"type": "resize", "cols": columns, "rows": lines}))

    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    previous = signal.signal(signal.SIGWINCH, resized)
    threading.Thread(target=screen, daemon=True).start()
    try:
        if saved is not None:
            # TCSADRAIN, not setraw's default TCSAFLUSH: what was typed while the session opened is kept (as by ssh)
            tty.setraw(stdin, termios.TCSADRAIN)
        while not ended.is_set():
            if not select.select([stdin], [], [], 0.1)[0]:
                continue
            data = os.read(stdin, 4096)
            if not data or DETACH in data:
                head = data.split(DETACH, 1)[0]
                if head:
                    ws.send(head)
                reason.append("detached; the session goes on")
                break
            ws.send(data)
    except ConnectionClosed:
        pass
    finally:
        with contextlib.suppress(Exception):
            ws.close()
        ended.wait(2)
        signal.signal(signal.SIGWINCH, previous)
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
    return reason[0] if reason else "the session ended"
