"""What E2B adds to a stasis sandbox, one JSON file per sandbox under ``e2b/``; the E2B room is its only writer."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from .... import hostpath
from ....fsutil import atomic_write

log = logging.getLogger(__name__)


class Record(BaseModel):
    """Only what stasis has no field for: its lifetime (E2B's timeout and auto-pause) is the sandbox's own
    (``lifetime_secs``, ``deadline``, ``on_idle``), kept and ended by the core. A record an older daemon wrote
    with a lifetime in it reads as this (the extra fields are ignored)."""

    sandbox_id: str
    template: str
    metadata: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)
    public_traffic: bool = False  # its ports answer without the envd access token
    e2b: bool = Field(
        False,
        description="made through the E2B face: only those take E2B's set_timeout (a record written by an "
        "older daemon, which gave one to any sandbox it listed, lacks the mark)",
    )


class Records:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, sandbox_id: str) -> Path:
        return hostpath.child(self.directory, f"{sandbox_id}.json", "sandbox id")

    def put(self, record: Record) -> None:
        atomic_write(self._path(record.sandbox_id), record.model_dump_json().encode(), mode=0o600)

    def get(self, sandbox_id: str) -> Record | None:
        try:
            return Record.model_validate_json(self._path(sandbox_id).read_bytes())
        except FileNotFoundError:
            return None
        except (ValidationError, json.JSONDecodeError) as exc:
            log.warning("ignoring the unreadable E2B record of %s: %s", sandbox_id, exc)
            return None

    def older_lifetime(self, sandbox_id: str) -> tuple[float, bool] | None:
        """(end_at, auto_pause) from a record an older daemon wrote with E2B's lifetime in it, else None."""
        try:
            raw = json.loads(self._path(sandbox_id).read_bytes())
            end_at, auto_pause = raw.get("end_at"), raw.get("auto_pause", False)
        except (OSError, ValueError, AttributeError):
            return None
        if raw.get("e2b") is not True or not isinstance(end_at, int | float) or not isinstance(auto_pause, bool):
            return None
        return float(end_at), auto_pause

    def all(self) -> list[Record]:
        records = []
        for path in sorted(self.directory.glob("sb-*.json")):
            if (record := self.get(path.stem)) is not None:
                records.append(record)
        return records

    def remove(self, sandbox_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(sandbox_id).unlink()
