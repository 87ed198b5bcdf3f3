"""The harness's durable journal: SQLite under $STASIS_HOME, one row per thing that happened.

Every model response is recorded before the harness acts on it; every tool call
is recorded (``intent``) before it is executed and its result (``done``) after.
A harness killed at any instant replays the journal: it never asks the model
again for a response it has, and never starts a tool call twice.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import RunNotFound
from ..fsutil import connect_sqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    model TEXT NOT NULL,
    task TEXT NOT NULL,
    max_steps INTEGER NOT NULL,
    status TEXT NOT NULL,           -- running | completed | step_limit | failed (read: interrupted)
    final TEXT,
    error TEXT,
    checkpoints TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    owner TEXT                      -- "pid:start time" of the process driving it
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,             -- system | model_response | tool_call | tool_result | resume
    key TEXT NOT NULL,              -- the response's step number, or the tool call's id
    payload TEXT NOT NULL,
    at REAL NOT NULL,
    seconds REAL,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, kind, key)      -- a step is never journalled twice
);
CREATE TABLE IF NOT EXISTS notes (
    sandbox_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    note TEXT NOT NULL,
    at REAL NOT NULL,
    UNIQUE (run_id, key)
);
"""


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    key: str
    payload: dict[str, Any]
    at: float
    seconds: float | None


@dataclass(frozen=True)
class RunRecord:
    id: str
    sandbox: str
    sandbox_id: str
    model: str
    task: str
    max_steps: int
    status: str
    final: str | None
    error: str | None
    checkpoints: list[str]
    created_at: float
    updated_at: float

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Journal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = connect_sqlite(path)
        self.db.executescript(SCHEMA)
        if "owner" not in {row["name"] for row in self.db.execute("PRAGMA table_info(runs)")}:  # older journals
            self.db.execute("ALTER TABLE runs ADD COLUMN owner TEXT")

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ runs

    def create_run(self, run_id: str, sandbox: str, sandbox_id: str, model: str, task: str, max_steps: int) -> None:
        now = time.time()
        self.db.execute(
            "INSERT INTO runs (id, sandbox, sandbox_id, model, task, max_steps, status, created_at, updated_at, owner)"
            " VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?)",
            (run_id, sandbox, sandbox_id, model, task, max_steps, now, now, this_process()),
        )

    def claim(self, run_id: str) -> None:
        """This process drives the run from now on (a resume of an interrupted one)."""
        self.db.execute("UPDATE runs SET owner = ?, updated_at = ? WHERE id = ?", (this_process(), time.time(), run_id))

    def run(self, run_id: str) -> RunRecord:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no agent run {run_id!r}; `stasis agent ls` lists them")
        return _run(row)

    def runs(self) -> list[RunRecord]:
        return [_run(row) for row in self.db.execute("SELECT * FROM runs ORDER BY created_at")]

    def finish_run(self, run_id: str, status: str, final: str | None = None, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE runs SET status = ?, final = ?, error = ?, updated_at = ? WHERE id = ?",
            (status, final, error, time.time(), run_id),
        )

    def add_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        checkpoints = self.run(run_id).checkpoints
        if checkpoint_id not in checkpoints:
            self.db.execute(
                "UPDATE runs SET checkpoints = ?, updated_at = ? WHERE id = ?",
                (json.dumps([*checkpoints, checkpoint_id]), time.time(), run_id),
            )

    # ------------------------------------------------------------ events

    def record(self, run_id: str, kind: str, key: str, payload: dict[str, Any], seconds: float | None = None) -> Event:
        """Append an event; recording the same (kind, key) again returns the first one unchanged."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            existing = self.db.execute(
                "SELECT * FROM events WHERE run_id = ? AND kind = ? AND key = ?", (run_id, kind, key)
            ).fetchone()
            if existing is not None:
                return _event(existing)
            (seq,) = self.db.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?", (run_id,)
            ).fetchone()
            now = time.time()
            self.db.execute(
                "INSERT INTO events (run_id, seq, kind, key, payload, at, seconds) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, seq, kind, key, json.dumps(payload), now, seconds),
            )
            self.db.execute("UPDATE runs SET updated_at = ? WHERE id = ?", (now, run_id))
        return Event(seq, kind, key, payload, now, seconds)

    def events(self, run_id: str) -> list[Event]:
        rows = self.db.execute("SELECT * FROM events WHERE run_id = ? ORDER BY seq", (run_id,))
        return [_event(row) for row in rows]

    # ------------------------------------------------------------ notes

    def remember(self, sandbox_id: str, run_id: str, key: str, note: str) -> None:
        self.db.execute(
            "INSERT OR IGNORE INTO notes (sandbox_id, run_id, key, note, at) VALUES (?, ?, ?, ?, ?)",
            (sandbox_id, run_id, key, note, time.time()),
        )

    def notes(self, sandbox_id: str) -> list[str]:
        rows = self.db.execute("SELECT note FROM notes WHERE sandbox_id = ? ORDER BY at", (sandbox_id,))
        return [row["note"] for row in rows]

    def run_notes(self, run_id: str) -> list[str]:
        rows = self.db.execute("SELECT note FROM notes WHERE run_id = ? ORDER BY at", (run_id,))
        return [row["note"] for row in rows]


def _run(row: sqlite3.Row) -> RunRecord:
    data = dict(row)
    data["checkpoints"] = json.loads(data["checkpoints"])
    owner = data.pop("owner", None)
    if data["status"] == "running" and not alive(owner):
        data["status"] = "interrupted"  # its process is gone (killed, crashed): `stasis agent resume` goes on
    return RunRecord(**data)


def this_process() -> str:
    return f"{os.getpid()}:{_start_time(os.getpid())}"


def alive(owner: str | None) -> bool:
    """Whether the process that wrote ``owner`` still runs (the same one: a reused pid has another start time)."""
    if not owner:
        return False
    pid, _, started = owner.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == started


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime (after the command's parentheses)


def _event(row: sqlite3.Row) -> Event:
    return Event(row["seq"], row["kind"], row["key"], json.loads(row["payload"]), row["at"], row["seconds"])
