"""The daemon's durable state: one SQLite file, written only by the daemon.

Every status change is one transaction that updates the sandbox row and appends
to the ``transitions`` journal, with ``synchronous=FULL`` so that what the
journal says survived a power cut.
"""

from __future__ import annotations

import functools
import json
import secrets
import sqlite3
import time
from pathlib import Path
from typing import Any

from ...errors import NameTaken, SandboxNotFound
from ...fsutil import connect_sqlite
from ...models import CreateSandboxRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ...validation import ID_PATTERN
from .events import event_of
from .states import check_transition, phase
from .tables import Tables

SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    name TEXT,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    backend_state TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    last_activity REAL NOT NULL,
    error TEXT,
    last_suspend_seconds REAL,
    last_resume_seconds REAL,
    image_key TEXT,
    from_checkpoint TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_live_name
    ON sandboxes(name) WHERE name IS NOT NULL AND status != 'terminated';
CREATE TABLE IF NOT EXISTS pools (   -- warm pools; their members are sandboxes whose 'pool' names them
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS transitions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id TEXT NOT NULL,
    at REAL NOT NULL,
    phase TEXT NOT NULL,
    from_status TEXT,
    to_status TEXT NOT NULL,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS transitions_by_sandbox ON transitions(sandbox_id, seq);
CREATE TABLE IF NOT EXISTS events (  -- lifecycle events, written with their transition: the webhooks' outbox
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    at REAL NOT NULL,
    type TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    sandbox_name TEXT,
    team TEXT,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS events_by_sandbox ON events(sandbox_id, seq);
CREATE INDEX IF NOT EXISTS events_by_team ON events(team, seq);
CREATE TABLE IF NOT EXISTS checkpoints (
    id TEXT PRIMARY KEY,
    name TEXT UNIQUE,
    status TEXT NOT NULL,            -- 'writing' (intent) or 'ready' (outcome)
    internal INTEGER NOT NULL DEFAULT 0,
    info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pushes (  -- a sandbox being handed to the remote store: settled after a restart
    sandbox_id TEXT PRIMARY KEY,
    push_id TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS teams (   -- tenants: their quotas; their keys below (only a key's hash is kept)
    name TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    quotas TEXT NOT NULL DEFAULT '{}',
    removed_at REAL                  -- a removed team's name is never used again: its history stays its own
);
CREATE TABLE IF NOT EXISTS team_keys (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    secret_sha256 TEXT NOT NULL,
    scopes TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL,
    last_used_at REAL,
    description TEXT NOT NULL DEFAULT '',
    made_by TEXT
);
CREATE TABLE IF NOT EXISTS webhooks (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    team TEXT,
    allow_private INTEGER NOT NULL,
    secret TEXT NOT NULL,
    created_at REAL NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    cursor INTEGER NOT NULL,         -- the last event it has a delivery for
    flavor TEXT NOT NULL DEFAULT 'stasis',
    name TEXT NOT NULL DEFAULT '',
    enabled INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    id TEXT PRIMARY KEY,
    webhook_id TEXT NOT NULL,
    event_seq INTEGER NOT NULL,
    status TEXT NOT NULL,            -- pending, delivered, failed
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL,
    delivered_at REAL,
    last_status INTEGER,
    last_error TEXT,
    last_duration_ms REAL,
    UNIQUE (webhook_id, event_seq)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON webhook_deliveries(webhook_id, status, next_at);
CREATE TABLE IF NOT EXISTS webhook_attempts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery_id TEXT NOT NULL,
    at REAL NOT NULL,
    status_code INTEGER,
    duration_ms REAL NOT NULL,
    error TEXT
);
CREATE TABLE IF NOT EXISTS ports (   -- exposed ports: the daemon listens for them again after a restart
    sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    public INTEGER NOT NULL,
    listen_port INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
"""


class Store:
    """The sandbox rows and their journal: the core's own (the rooms' tables are :mod:`.tables`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = connect_sqlite(path)
        self.db.executescript(SCHEMA)
        self._migrate()
        self.tables = Tables.on(self.db)

    def _migrate(self) -> None:
        """Homes made before the daemon's facts had columns kept them in backend_state."""
        columns = {row["name"] for row in self.db.execute("PRAGMA table_info(sandboxes)")}
        with self.db:
            for column in ("image_key", "from_checkpoint"):
                if column not in columns:
                    self.db.execute(f"ALTER TABLE sandboxes ADD COLUMN {column} TEXT")
                    self.db.execute(
                        f"UPDATE sandboxes SET {column} = json_extract(backend_state, '$.{column}'), "
                        f"backend_state = json_remove(backend_state, '$.{column}')"
                    )
            # a waiting pool member's pool; the pool a claimed one came from; the sandbox a fork copies
            # ... and where a sandbox that left this node went (the remote store's manifest)
            for column in ("pool", "from_pool", "forked_from", "moved_to"):
                if column not in columns:
                    self.db.execute(f"ALTER TABLE sandboxes ADD COLUMN {column} TEXT")
            if "deadline" not in columns:  # when its lifetime ends (E2B's timeout), used or not
                self.db.execute("ALTER TABLE sandboxes ADD COLUMN deadline REAL")
            if "made_by" not in {row["name"] for row in self.db.execute("PRAGMA table_info(team_keys)")}:
                self.db.execute("ALTER TABLE team_keys ADD COLUMN made_by TEXT")  # the key that made it; owner: NULL
            self.db.execute("CREATE INDEX IF NOT EXISTS team_keys_by_maker ON team_keys(made_by)")
            self.db.execute("CREATE INDEX IF NOT EXISTS sandboxes_live ON sandboxes(status, created_at, id)")
            self.db.execute("CREATE INDEX IF NOT EXISTS sandboxes_by_pool ON sandboxes(pool) WHERE pool IS NOT NULL")

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------ reads

    def get(self, ref: str) -> SandboxInfo:
        """By id, or by the name of a sandbox that is not terminated."""
        if ID_PATTERN.fullmatch(ref):
            row = self.db.execute("SELECT * FROM sandboxes WHERE id = ?", (ref,)).fetchone()
        else:
            row = self.db.execute(
                "SELECT * FROM sandboxes WHERE name = ? AND status != 'terminated'", (ref,)
            ).fetchone()
        if row is None:
            shown = ref if len(ref) <= 80 else ref[:80] + "..."
            moved = self.db.execute(
                "SELECT moved_to FROM sandboxes WHERE (id = ? OR name = ?) AND moved_to IS NOT NULL "
                "ORDER BY updated_at DESC LIMIT 1", (ref, ref),
            ).fetchone()  # fmt: skip
            if moved is not None:
                raise SandboxNotFound(
                    f"sandbox {shown!r} was pushed to the remote store ({moved['moved_to']}) and left this node: "
                    f"`stasis resume {shown}` takes it back (`stasis remote` lists what the store holds)",
                    ref=shown,
                )
            raise SandboxNotFound(f"no sandbox named or with id {shown!r}; `stasis ls` lists them", ref=shown)
        return _info(row)

    def list(
        self,
        include_terminated: bool = False,
        *,
        include_pooled: bool = True,
        limit: int | None = None,
        after: tuple[float, str] | None = None,
        status: SandboxStatus | None = None,
    ) -> list[SandboxInfo]:
        """Oldest first; ``include_pooled`` False leaves out waiting pool members (not user sandboxes yet);
        ``limit`` and ``after`` (the created_at and id of the last one seen) page through them; ``status``
        keeps only those in it."""
        where: list[str] = []
        args: list[Any] = []
        if not include_terminated:
            where.append("status != 'terminated'")
        if status is not None:
            where.append("status = ?")
            args.append(status.value)
        if not include_pooled:
            where.append("pool IS NULL")
        if after is not None:
            where.append("(created_at, id) > (?, ?)")
            args += list(after)
        query = "SELECT * FROM sandboxes" + (" WHERE " + " AND ".join(where) if where else "")
        query += " ORDER BY created_at, id" + (" LIMIT ?" if limit is not None else "")
        return [_info(row) for row in self.db.execute(query, (*args, *([limit] if limit is not None else [])))]

    def transitions(self, sandbox_id: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT at, phase, from_status, to_status, detail FROM transitions WHERE sandbox_id = ? ORDER BY seq",
            (sandbox_id,),
        )
        return [dict(row) for row in rows]

    # ------------------------------------------------------------ writes

    def insert_sandbox(
        self,
        sandbox_id: str,
        name: str | None,
        spec: SandboxSpec,
        image_key: str,
        from_checkpoint: str | None = None,
        pool: str | None = None,
        forked_from: str | None = None,
    ) -> SandboxInfo:
        now = time.time()
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                columns = "id, name, status, spec, image_key, from_checkpoint, pool, forked_from, created_at, "
                columns += "updated_at, last_activity"
                values = (sandbox_id, name, SandboxStatus.PENDING.value, spec.model_dump_json(), image_key)
                values += (from_checkpoint, pool, forked_from, now, now, now)
                marks = ", ".join("?" * len(values))
                self.db.execute(f"INSERT INTO sandboxes ({columns}) VALUES ({marks})", values)
                self._journal(sandbox_id, None, SandboxStatus.PENDING, "create")
        except sqlite3.IntegrityError as exc:
            raise NameTaken(
                f"a sandbox named {name!r} already exists; pick another name or remove it with `stasis rm {name}`",
                name=name,
            ) from exc
        return self.get(sandbox_id)

    def arrive(self, info: SandboxInfo, detail: str) -> SandboxInfo:
        """A suspended sandbox pulled from another node: its record as it was there, suspended here. An old
        record of the same id (it left this node once and comes back) is replaced."""
        values = (info.id, info.name, SandboxStatus.SUSPENDED.value, info.spec.model_dump_json(),
                  json.dumps(info.runtime), info.created_at, time.time(), time.time(), info.image_key,
                  info.from_checkpoint, info.last_suspend_seconds, info.forked_from)  # fmt: skip
        columns = "id, name, status, spec, backend_state, created_at, updated_at, last_activity, image_key, "
        columns += "from_checkpoint, last_suspend_seconds, forked_from"
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute("DELETE FROM sandboxes WHERE id = ?", (info.id,))
                self.db.execute(f"INSERT INTO sandboxes ({columns}) VALUES ({', '.join('?' * len(values))})", values)
                self._journal(info.id, None, SandboxStatus.SUSPENDED, detail)
        except sqlite3.IntegrityError as exc:
            raise NameTaken(
                f"a sandbox named {info.name!r} already exists on this node; remove or rename it, then pull again",
                name=info.name,
            ) from exc
        return self.get(info.id)

    def transition(
        self,
        sandbox_id: str,
        target: SandboxStatus,
        detail: str | None = None,
        *,
        error: str | None = None,
        **fields: Any,
    ) -> SandboxInfo:
        """Move a sandbox to ``target`` (checked against the state table), journalled atomically."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            row = self.db.execute("SELECT status FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
            if row is None:
                raise SandboxNotFound(f"no sandbox with id {sandbox_id!r}")
            current = SandboxStatus(row["status"])
            check_transition(sandbox_id, current, target)
            values: dict[str, Any] = {
                "status": target.value,
                "updated_at": time.time(),
                "error": error,
                **fields,
            }
            if "backend_state" in values:
                values["backend_state"] = json.dumps(values["backend_state"])
            assignments = ", ".join(f"{column} = ?" for column in values)
            self.db.execute(f"UPDATE sandboxes SET {assignments} WHERE id = ?", (*values.values(), sandbox_id))
            self._journal(sandbox_id, current, target, detail or error)
        return self.get(sandbox_id)

    def update_spec(self, sandbox_id: str, spec: SandboxSpec, detail: str) -> SandboxInfo:
        """A change of what a sandbox may do (its network policy) that is not a status change."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            current = SandboxStatus(self.get(sandbox_id).status)
            self.db.execute(
                "UPDATE sandboxes SET spec = ?, updated_at = ? WHERE id = ?",
                (spec.model_dump_json(), time.time(), sandbox_id),
            )
            self._journal(sandbox_id, current, current, detail)
        return self.get(sandbox_id)

    def claim_member(self, pool: str, image_key: str, request: CreateSandboxRequest) -> SandboxInfo | None:
        """Hand the oldest running member of ``pool`` on ``image_key`` to a user, with the request's name and
        idle policy, in one transaction: two claims never get the same member. None if none is ready."""
        try:
            with self.db:
                self.db.execute("BEGIN IMMEDIATE")
                row = self.db.execute(
                    "SELECT id FROM sandboxes WHERE pool = ? AND status = 'running' AND image_key = ? "
                    "ORDER BY created_at LIMIT 1",
                    (pool, image_key),
                ).fetchone()
                if row is None:
                    return None
                now = time.time()
                self.db.execute(
                    "UPDATE sandboxes SET pool = NULL, from_pool = ?, name = ?, "
                    "spec = json_set(spec, '$.timeout_secs', ?, '$.on_idle', ?, '$.lifetime_secs', ?), "
                    "created_at = ?, updated_at = ?, last_activity = ? WHERE id = ?",
                    (
                        pool,
                        request.name,
                        request.timeout_secs,
                        request.on_idle,
                        request.lifetime_secs,
                        now,
                        now,
                        now,
                        row["id"],
                    ),
                )
                self._journal(row["id"], SandboxStatus.RUNNING, SandboxStatus.RUNNING, f"claimed from pool {pool}")
        except sqlite3.IntegrityError as exc:
            raise NameTaken(
                f"a sandbox named {request.name!r} already exists; pick another name or remove it with "
                f"`stasis rm {request.name}`",
                name=request.name,
            ) from exc
        return self.get(row["id"])

    def pool_members(self, pool: str | None = None) -> list[SandboxInfo]:
        """Waiting members of ``pool`` (of every pool if None), terminated ones left out."""
        query, args = "SELECT * FROM sandboxes WHERE pool IS NOT NULL AND status != 'terminated'", ()
        if pool is not None:
            query, args = query + " AND pool = ?", (pool,)
        return [_info(row) for row in self.db.execute(query + " ORDER BY created_at", args)]

    def touch_at(self, sandbox_id: str, when: float) -> None:
        self.db.execute("UPDATE sandboxes SET last_activity = ? WHERE id = ?", (when, sandbox_id))

    def set_deadline(self, sandbox_id: str, deadline: float | None, detail: str) -> SandboxInfo:
        """When its lifetime ends (its idle action runs then, used or not); None: no deadline."""
        with self.db:
            self.db.execute("BEGIN IMMEDIATE")
            current = SandboxStatus(self.get(sandbox_id).status)
            self.db.execute("UPDATE sandboxes SET deadline = ? WHERE id = ?", (deadline, sandbox_id))
            self._journal(sandbox_id, current, current, detail)
        return self.get(sandbox_id)

    def _journal(
        self, sandbox_id: str, current: SandboxStatus | None, target: SandboxStatus, detail: str | None
    ) -> None:
        """The transition, and in the same transaction the lifecycle event it makes (if any)."""
        intent = self.db.execute(
            "SELECT detail FROM transitions WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1", (sandbox_id,)
        ).fetchone()
        now = time.time()
        self.db.execute(
            "INSERT INTO transitions (sandbox_id, at, phase, from_status, to_status, detail) VALUES (?, ?, ?, ?, ?, ?)",
            (sandbox_id, now, phase(target), current.value if current else None, target.value, detail),
        )
        row = self.db.execute(
            "SELECT name, pool, forked_from, json_extract(spec, '$.team') AS team FROM sandboxes WHERE id = ?",
            (sandbox_id,),
        ).fetchone()
        made = event_of(current, target, detail, intent["detail"] if intent else None, row and row["forked_from"])
        if row is not None and made is not None and row["pool"] is None:  # a pool's waiting member: not yet anyone's
            self.db.execute(
                "INSERT INTO events (id, at, type, sandbox_id, sandbox_name, team, reason) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                ("ev_" + secrets.token_hex(12), now, made[0], sandbox_id, row["name"], row["team"], made[1]),
            )


@functools.lru_cache(maxsize=4096)
def _spec(text: str) -> SandboxSpec:
    """A spec is written once and read on every request: parsed once per text (never changed in place)."""
    return SandboxSpec.model_validate_json(text)


def _info(row: sqlite3.Row) -> SandboxInfo:
    return SandboxInfo(
        id=row["id"],
        name=row["name"],
        status=SandboxStatus(row["status"]),
        spec=_spec(row["spec"]),
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        last_activity=row["last_activity"],
        error=row["error"],
        image_key=row["image_key"],
        from_checkpoint=row["from_checkpoint"],
        runtime=json.loads(row["backend_state"]),
        last_suspend_seconds=row["last_suspend_seconds"],
        last_resume_seconds=row["last_resume_seconds"],
        from_pool=row["from_pool"],
        pool=row["pool"],
        forked_from=row["forked_from"],
        moved_to=row["moved_to"],
        deadline=row["deadline"],
    )
