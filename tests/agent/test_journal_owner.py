"""A run is `running` while the process driving it lives, `interrupted` once it is gone (a pid reused later
by another process does not count)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stasis.agent import Journal
from stasis.agent.journal import this_process

pytestmark = pytest.mark.fast


def test_a_runs_status_follows_its_owner(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "agent.db")
    journal.create_run("run-1", "box", "sb-1", "m", "task", 5)
    assert journal.run("run-1").status == "running"  # this process drives it
    pid, _, started = this_process().partition(":")
    for gone in ("999999999:1", f"{pid}:{int(started) + 1}"):  # no such process; this pid, another start
        journal.db.execute("UPDATE runs SET owner = ? WHERE id = 'run-1'", (gone,))
        assert journal.run("run-1").status == "interrupted"
    journal.claim("run-1")
    assert journal.run("run-1").status == "running"
    journal.finish_run("run-1", "completed", final="done")
    assert journal.run("run-1").status == "completed"
    journal.close()
