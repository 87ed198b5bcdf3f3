"""The tables the rooms own, one class each, on the daemon's one SQLite file (:mod:`.store` opens it and keeps
the schema). The core hands each to its one owner through the wiring: checkpoints to
:mod:`..rooms.checkpointing`, pools to :mod:`..rooms.pools`, exposed ports to :mod:`..rooms.ports`, pushes to
:mod:`..rooms.remote`, teams and their keys to :mod:`..rooms.teams`, webhooks to :mod:`..rooms.webhooks`;
``tests/test_architecture.py`` holds that nothing else writes them."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from ...errors import CheckpointNotFound, NameTaken
from ...models import CheckpointInfo
from ...team_models import KeyInfo, TeamInfo, TeamQuotas
from ...webhook_models import AttemptInfo, DeliveryInfo, WebhookInfo


class Table:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db


class CheckpointTable(Table):
    """Checkpoints: 'writing' (the intent) until sealed 'ready' (the outcome)."""

    def insert_ready_checkpoint(self, info: CheckpointInfo) -> None:
        """A checkpoint whose files are whole already (pulled from the remote store)."""
        try:
            with self.db:
                self.db.execute(
                    "INSERT INTO checkpoints (id, name, status, internal, info) VALUES (?, ?, 'ready', 0, ?)",
                    (info.id, info.name, info.model_dump_json()),
                )
        except sqlite3.IntegrityError as exc:
            raise NameTaken(f"a different checkpoint named {info.name!r} is on this node already") from exc

    def insert_checkpoint(self, info: CheckpointInfo, internal: bool = False) -> None:
        try:
            self.db.execute(
                "INSERT INTO checkpoints (id, name, status, internal, info) VALUES (?, ?, 'writing', ?, ?)",
                (info.id, info.name, int(internal), info.model_dump_json()),
            )
        except sqlite3.IntegrityError as exc:
            raise NameTaken(f"a checkpoint named {info.name!r} already exists; pick another name") from exc

    def seal_checkpoint(self, info: CheckpointInfo) -> None:
        self.db.execute(
            "UPDATE checkpoints SET status = 'ready', info = ? WHERE id = ?", (info.model_dump_json(), info.id)
        )

    def delete_checkpoint(self, checkpoint_id: str) -> None:
        self.db.execute("DELETE FROM checkpoints WHERE id = ?", (checkpoint_id,))

    def get_checkpoint(self, ref: str) -> CheckpointInfo:
        row = self.db.execute(
            "SELECT info FROM checkpoints WHERE status = 'ready' AND (id = ? OR name = ?)", (ref, ref)
        ).fetchone()
        if row is None:
            raise CheckpointNotFound(f"no checkpoint named or with id {ref[:80]!r}; `stasis checkpoints` lists them")
        return CheckpointInfo.model_validate_json(row["info"])

    def list_checkpoints(self, include_internal: bool = False) -> list[CheckpointInfo]:
        query = "SELECT info FROM checkpoints WHERE status = 'ready'" + (
            "" if include_internal else " AND internal = 0"
        )
        infos = [CheckpointInfo.model_validate_json(row["info"]) for row in self.db.execute(query)]
        return sorted(infos, key=lambda c: c.created_at)

    def unfinished_checkpoints(self) -> list[str]:
        """Checkpoints whose writing was cut off, and internal ones (a fork's) left by a crash."""
        rows = self.db.execute("SELECT id FROM checkpoints WHERE status != 'ready' OR internal = 1")
        return [row["id"] for row in rows]

    def all_checkpoint_ids(self) -> set[str]:
        return {row["id"] for row in self.db.execute("SELECT id FROM checkpoints")}


class PoolTable(Table):
    """Warm pools by name; their members are sandbox rows (the core's) whose ``pool`` names them."""

    def save_pool(self, name: str, spec_json: str) -> None:
        try:
            self.db.execute(
                "INSERT INTO pools (name, spec, created_at) VALUES (?, ?, ?)", (name, spec_json, time.time())
            )
        except sqlite3.IntegrityError as exc:
            raise NameTaken(f"a pool named {name!r} exists; remove it first with `stasis pool rm {name}`") from exc

    def pools(self) -> dict[str, str]:
        """Each pool's name and its spec (JSON), oldest first."""
        return {row["name"]: row["spec"] for row in self.db.execute("SELECT * FROM pools ORDER BY created_at")}

    def delete_pool(self, name: str) -> None:
        self.db.execute("DELETE FROM pools WHERE name = ?", (name,))


class PortTable(Table):
    """Exposed ports: the daemon listens for them again after a restart."""

    def save_port(self, sandbox_id: str, port: int, public: bool, listen_port: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO ports (sandbox_id, port, public, listen_port) VALUES (?, ?, ?, ?)",
            (sandbox_id, port, int(public), listen_port),
        )

    def list_ports(self, sandbox_id: str | None = None) -> list[tuple[str, int, bool, int]]:
        query, args = "SELECT * FROM ports", ()
        if sandbox_id is not None:
            query, args = query + " WHERE sandbox_id = ?", (sandbox_id,)
        rows = self.db.execute(query + " ORDER BY sandbox_id, port", args)
        return [(r["sandbox_id"], r["port"], bool(r["public"]), r["listen_port"]) for r in rows]

    def delete_ports(self, sandbox_id: str, port: int | None = None) -> None:
        if port is None:
            self.db.execute("DELETE FROM ports WHERE sandbox_id = ?", (sandbox_id,))
        else:
            self.db.execute("DELETE FROM ports WHERE sandbox_id = ? AND port = ?", (sandbox_id, port))


class PushTable(Table):
    """Sandboxes being handed to the remote store: settled against it after a restart."""

    def begin_push(self, sandbox_id: str, push_id: str) -> None:
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO pushes VALUES (?, ?, ?)", (sandbox_id, push_id, time.time()))

    def end_push(self, sandbox_id: str) -> None:
        with self.db:
            self.db.execute("DELETE FROM pushes WHERE sandbox_id = ?", (sandbox_id,))

    def pushes(self) -> dict[str, str]:
        """Pushes cut off before they settled: sandbox id → push id."""
        return {row["sandbox_id"]: row["push_id"] for row in self.db.execute("SELECT * FROM pushes")}


class TeamTable(Table):
    """Teams and their keys (:mod:`..rooms.teams`)."""

    def insert_team(self, team: TeamInfo) -> None:
        try:
            self.db.execute("INSERT INTO teams (name, created_at, quotas) VALUES (?, ?, ?)",
                                (team.name, team.created_at, team.quotas.model_dump_json()))  # fmt: skip
        except sqlite3.IntegrityError:
            raise NameTaken(f"a team named {team.name!r} exists, or existed (a name is never used again: its "
                            "sandboxes' usage and events stay that team's); pick another") from None  # fmt: skip

    def delete_team(self, name: str) -> None:
        with self.db:  # one transaction: a removed team has no key left that works
            self.db.execute("BEGIN")
            self.db.execute("UPDATE team_keys SET revoked_at = ? WHERE team = ? AND revoked_at IS NULL",
                            (time.time(), name))  # fmt: skip
            self.db.execute("UPDATE teams SET removed_at = ? WHERE name = ?", (time.time(), name))

    def update_quotas(self, name: str, quotas: TeamQuotas) -> None:
        self.db.execute("UPDATE teams SET quotas = ? WHERE name = ?", (quotas.model_dump_json(), name))

    def teams(self) -> list[TeamInfo]:
        rows = self.db.execute("SELECT * FROM teams WHERE removed_at IS NULL ORDER BY name").fetchall()
        return [TeamInfo(name=r["name"], created_at=r["created_at"],
                         quotas=TeamQuotas.model_validate_json(r["quotas"])) for r in rows]  # fmt: skip

    def insert_key(self, key: KeyInfo, secret_sha256: str) -> None:
        self.db.execute(
            "INSERT INTO team_keys (id, team, secret_sha256, scopes, created_at, expires_at, description, made_by) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (key.id, key.team, secret_sha256, json.dumps(key.scopes), key.created_at, key.expires_at,
             key.description, key.made_by),
        )  # fmt: skip

    def revoke_key(self, key_id: str) -> list[str]:
        """Revoke the key and every key made by it, or by those, in one transaction; the ids revoked now."""
        with self.db:
            rows = self.db.execute(
                "WITH RECURSIVE made(id) AS (SELECT ? UNION SELECT k.id FROM team_keys k JOIN made ON k.made_by = "
                "made.id) SELECT team_keys.id FROM team_keys JOIN made USING (id) WHERE revoked_at IS NULL",
                (key_id,),
            )
            lineage = [row["id"] for row in rows]
            now = time.time()
            self.db.executemany("UPDATE team_keys SET revoked_at = ? WHERE id = ?", [(now, i) for i in lineage])
        return lineage

    def key_used(self, key_id: str, at: float) -> None:
        self.db.execute("UPDATE team_keys SET last_used_at = ? WHERE id = ?", (at, key_id))

    def key_row(self, key_id: str) -> tuple[KeyInfo, str] | None:
        """A key and its secret's hash."""
        row = self.db.execute("SELECT * FROM team_keys WHERE id = ?", (key_id,)).fetchone()
        return None if row is None else (_key(row), row["secret_sha256"])

    def keys(self, team: str | None = None) -> list[KeyInfo]:
        rows = self.db.execute("SELECT * FROM team_keys WHERE ? IS NULL OR team = ? ORDER BY created_at",
                               (team, team)).fetchall()  # fmt: skip
        return [_key(r) for r in rows]


def _key(row: sqlite3.Row) -> KeyInfo:
    return KeyInfo(
        id=row["id"],
        team=row["team"],
        scopes=json.loads(row["scopes"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
        last_used_at=row["last_used_at"],
        description=row["description"],
        made_by=row["made_by"],
    )


class WebhookTable(Table):
    """Webhooks, their deliveries (one per webhook and event) and every attempt (:mod:`..rooms.webhooks`)."""

    def insert_webhook(self, hook: WebhookInfo, secret: str, cursor: int) -> None:
        self.db.execute(
            "INSERT INTO webhooks (id, url, events, team, allow_private, secret, created_at, description, cursor, "
            "flavor, name, enabled) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (hook.id, hook.url, json.dumps(hook.events), hook.team, int(hook.allow_private), secret,
             hook.created_at, hook.description, cursor, hook.flavor, hook.name, int(hook.enabled)),
        )  # fmt: skip

    def update_webhook(self, hook: WebhookInfo, secret: str) -> None:
        self.db.execute(
            "UPDATE webhooks SET url = ?, events = ?, name = ?, enabled = ?, secret = ? WHERE id = ?",
            (hook.url, json.dumps(hook.events), hook.name, int(hook.enabled), secret, hook.id),
        )

    def delete_webhook(self, hook_id: str) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute("DELETE FROM webhook_attempts WHERE delivery_id IN "
                            "(SELECT id FROM webhook_deliveries WHERE webhook_id = ?)", (hook_id,))  # fmt: skip
            self.db.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?", (hook_id,))
            self.db.execute("DELETE FROM webhooks WHERE id = ?", (hook_id,))

    def webhooks(self) -> list[tuple[WebhookInfo, str, int]]:
        """Each webhook, its secret and its cursor."""
        rows = self.db.execute("SELECT * FROM webhooks ORDER BY created_at").fetchall()
        return [(WebhookInfo(id=r["id"], url=r["url"], events=json.loads(r["events"]), team=r["team"],
                             allow_private=bool(r["allow_private"]), created_at=r["created_at"],
                             description=r["description"], flavor=r["flavor"], name=r["name"],
                             enabled=bool(r["enabled"])), r["secret"], r["cursor"]) for r in rows]  # fmt: skip

    def enqueue(self, hook_id: str, event_seqs: list[int], cursor: int, now: float) -> None:
        """Deliveries of these events, and the cursor past them, in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            for seq in event_seqs:
                self.db.execute(
                    "INSERT OR IGNORE INTO webhook_deliveries (id, webhook_id, event_seq, status, next_at) "
                    "VALUES (?, ?, ?, 'pending', ?)", (f"dl_{hook_id[3:]}_{seq}", hook_id, seq, now),
                )  # fmt: skip
            self.db.execute("UPDATE webhooks SET cursor = ? WHERE id = ?", (cursor, hook_id))

    def pending(self, hook_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """A webhook's pending deliveries, oldest event first, with their event."""
        rows = self.db.execute(
            "SELECT d.*, e.id AS event_id, e.type AS event_type, e.at AS event_at, e.sandbox_id, e.sandbox_name, "
            "e.team, e.reason FROM webhook_deliveries d JOIN events e ON e.seq = d.event_seq "
            "WHERE d.webhook_id = ? AND d.status = 'pending' ORDER BY d.event_seq LIMIT ?",
            (hook_id, limit),
        )  # fmt: skip
        return [dict(row) for row in rows]

    def attempted(self, delivery_id: str, outcome: dict[str, Any]) -> None:
        """One attempt's outcome, logged, and the delivery's state after it, in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT INTO webhook_attempts (delivery_id, at, status_code, duration_ms, error) "
                "VALUES (?, ?, ?, ?, ?)",
                (delivery_id, outcome["at"], outcome["code"], outcome["ms"], outcome["error"]),
            )
            self.db.execute(
                "UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_at = ?, delivered_at = ?, "
                "last_status = ?, last_error = ?, last_duration_ms = ? WHERE id = ?",
                (outcome["status"], outcome["next_at"], outcome["delivered_at"], outcome["code"], outcome["error"],
                 outcome["ms"], delivery_id),
            )  # fmt: skip

    def retry_now(self, delivery_id: str, now: float) -> bool:
        done = self.db.execute(
            "UPDATE webhook_deliveries SET status = 'pending', next_at = ? WHERE id = ?", (now, delivery_id)
        )
        return done.rowcount > 0

    def deliveries(self, hook_id: str, limit: int = 100) -> list[DeliveryInfo]:
        rows = self.db.execute(
            "SELECT d.*, e.id AS event_id, e.type AS event_type, e.sandbox_id FROM webhook_deliveries d "
            "JOIN events e ON e.seq = d.event_seq WHERE d.webhook_id = ? ORDER BY d.event_seq DESC LIMIT ?",
            (hook_id, limit),
        )  # fmt: skip
        fields = set(DeliveryInfo.model_fields)
        return [DeliveryInfo(**{k: v for k, v in dict(r).items() if k in fields}) for r in rows]

    def attempts(self, delivery_id: str) -> list[AttemptInfo]:
        rows = self.db.execute(
            "SELECT at, status_code, duration_ms, error FROM webhook_attempts WHERE delivery_id = ? ORDER BY seq",
            (delivery_id,),
        )
        return [AttemptInfo(**dict(r)) for r in rows]


@dataclass(frozen=True)
class Tables:
    checkpoints: CheckpointTable
    pools: PoolTable
    ports: PortTable
    pushes: PushTable
    teams: TeamTable
    webhooks: WebhookTable

    @classmethod
    def on(cls, db: sqlite3.Connection) -> Tables:
        return cls(CheckpointTable(db), PoolTable(db), PortTable(db), PushTable(db), TeamTable(db), WebhookTable(db))
