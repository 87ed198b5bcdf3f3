"""Lifecycle events: what a sandbox's transition means to someone outside it (a webhook). Each is written in the
transition's own transaction (:meth:`.store.Store._journal`), so the ``events`` table is a durable outbox: an
event exists exactly when its transition does, and a daemon killed before delivering it delivers it after."""

from __future__ import annotations

import sqlite3
from typing import Any

from ...models import SandboxStatus

S = SandboxStatus


def event_of(
    current: S | None, target: S, detail: str | None, intent: str | None, forked_from: str | None
) -> tuple[str, str | None] | None:
    """(type, reason) of a transition from ``current`` to ``target``, or None for a step nobody outside sees
    (an intent such as ``suspending``). ``intent``: the detail of the intent this outcome ends."""
    detail = detail or ""
    if target == S.RUNNING:
        if current == S.PENDING:
            return ("forked", f"fork of {forked_from}") if forked_from else ("created", None)
        if current == S.RESUMING:
            return "resumed", intent or None
        if current == S.SNAPSHOTTING:
            return "checkpointed", None
        if current == S.RUNNING:
            return ("created", detail) if detail.startswith("claimed from pool") else ("updated", detail or None)
        return None  # a suspend rolled back: it never stopped running
    if target == S.SUSPENDED:
        if current is None:
            return "moved", detail or "arrived"
        if current == S.SUSPENDING:
            return "suspended", "idle" if "idle" in (intent or "") else "request"
        if current == S.SUSPENDED:
            return "updated", detail or None
        return None
    if target == S.TERMINATED:
        return ("moved", detail) if detail.startswith("moved to") else ("killed", detail or None)
    if target == S.FAILED:
        return "failed", detail or None
    return None


def after(db: sqlite3.Connection, seq: int, limit: int = 500) -> list[dict[str, Any]]:
    """Lifecycle events past ``seq``, oldest first."""
    rows = db.execute("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit))
    return [dict(row) for row in rows]


def page(
    db: sqlite3.Connection, sandbox_id: str | None, team: str | None, types: list[str], offset: int, limit: int,
    ascending: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """Events of one sandbox (or all), of one team (or all), of these types (or all), a page of them."""
    where, args = ["1"], []
    for column, value in (("sandbox_id", sandbox_id), ("team", team)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if types:
        where.append(f"type IN ({', '.join('?' * len(types))})")
        args += types
    order = "ASC" if ascending else "DESC"
    query = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY seq {order} LIMIT ? OFFSET ?"
    return [dict(row) for row in db.execute(query, (*args, limit, offset))]


def last(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT MAX(seq) AS seq FROM events").fetchone()
    return int(row["seq"] or 0)
