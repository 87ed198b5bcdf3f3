"""Text a sandbox chose reaches the terminal as text: a claimed name, a process name, an error never carries a
control sequence (a retitled window, a cleared screen, a forged line) or Rich markup."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console, RenderableType

from stasis.cli.network import egress_line
from stasis.cli.quick import printable
from stasis.cli.sandboxes import info_table, process_table
from stasis.models import ProcessInfo, SandboxInfo, SandboxSpec
from stasis.netpolicy import NetworkPolicy

pytestmark = pytest.mark.fast

HOSTILE = "evil.example\x1b]0;owned\x07\x1b[2J\r\nforged line\u202e[bold]loud[/bold]\x9b31m"


def rendered(thing: RenderableType) -> str:
    screen = io.StringIO()
    Console(file=screen, width=400, color_system=None).print(thing, highlight=False)
    return screen.getvalue()


def assert_shown_as_text(screen: str) -> None:
    assert not any(c in screen for c in "\x1b\x07\r\x9b\u202e"), repr(screen)
    assert "\\x1b]0;owned\\x07" in screen and "[bold]loud[/bold]" in screen  # visible, and not markup


def test_printable_escapes_every_control_character_and_keeps_lines_when_asked() -> None:
    assert printable("a\x1b[31mb\x00\x7f\x85\u2028") == "a\\x1b[31mb\\x00\\x7f\\x85\\u2028"
    assert printable("one\ntwo\tthree\x1b", lines=True) == "one\ntwo\tthree\\x1b"
    assert printable("one\ntwo") == "one\\x0atwo"
    assert printable("naïve ✓ 日本") == "naïve ✓ 日本"


def test_an_egress_line_shows_the_sandboxs_claims_as_text() -> None:
    line = {"time": time.time(), "verdict": "denied", "destination": "203.0.113.7", "port": 443, "name": HOSTILE,
            "rule": "allow_out", "error": HOSTILE}  # fmt: skip
    screen = rendered(egress_line(line))
    assert_shown_as_text(screen)
    assert screen.count("\n") == 1  # one connection, one line


def test_ps_and_info_show_what_the_sandbox_reported_as_text() -> None:
    process = ProcessInfo(id="p1", pid=7, name=HOSTILE, cmd=["sh", "-c", HOSTILE], status="running", exit_code=None,
                          started_at=time.time(), finished_at=None, stdout_bytes=0, stderr_bytes=0)  # fmt: skip
    assert_shown_as_text(rendered(process_table([process])))
    now = time.time()
    info = SandboxInfo(id="sb-000000000000", name="n", status="failed", created_at=now, updated_at=now,
                       last_activity=now, error=HOSTILE, runtime={"platform": HOSTILE},
                       spec=SandboxSpec(network=NetworkPolicy(note="allowOut narrows nothing")))  # fmt: skip
    screen = rendered(info_table(info))
    assert_shown_as_text(screen)
    assert "public internet; note: allowOut narrows nothing" in screen
