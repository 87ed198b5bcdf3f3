"""The audit log: who (the owner, or a team's key) did what (every request that may change something, and every
refused one) to which resource (its path), when, from where, and what came of it (the status).

Kept in ``audit.db`` beside the daemon's own file, in WAL mode with ``synchronous=NORMAL``: a commit survives the
daemon's death (it is in the log file the moment it returns) and costs no fsync; a power cut may lose the last
ones. Reads (GET, HEAD) that succeed are not logged: they change nothing, and the log stays about what did. A
request with no valid credentials is logged as ``anonymous``; the newest KEEP entries are kept.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel

SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    team TEXT,
    key_id TEXT,
    client TEXT,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    status INTEGER NOT NULL,
    duration_ms REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_by_team ON audit(team, seq);
"""


class AuditEntry(BaseModel):
    seq: int
    at: float
    team: str | None = None
    key_id: str | None = None
    client: str | None = None
    method: str
    path: str
    status: int
    duration_ms: float


KEEP = 1_000_000  # entries kept: the oldest go past this (anyone may make refused requests)
PRUNE_EVERY = 10_000


class AuditLog:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._written = 0

    def record(self, entry: dict[str, Any]) -> None:
        with self._lock:
            seq = self.db.execute(
                "INSERT INTO audit (at, team, key_id, client, method, path, status, duration_ms) "
                "VALUES (:at, :team, :key_id, :client, :method, :path, :status, :duration_ms)", entry,
            ).lastrowid  # fmt: skip
            self._written += 1
            if self._written % PRUNE_EVERY == 0 and seq is not None:
                self.db.execute("DELETE FROM audit WHERE seq <= ?", (seq - KEEP,))

    def entries(self, after: int = 0, team: str | None = None, limit: int = 1000) -> list[AuditEntry]:
        query = "SELECT * FROM audit WHERE seq > ? AND (? IS NULL OR team = ?) ORDER BY seq LIMIT ?"
        with self._lock:
            rows = self.db.execute(query, (after, team, team, limit)).fetchall()
        return [AuditEntry(**dict(row)) for row in rows]

    def close(self) -> None:
        self.db.close()
