"""The daemon's secrets: one file each (0600, in a 0700 directory), read once at start, kept in memory.

A value leaves this module only towards the egress proxy (:meth:`SecretStore.value`); every read for a
client is a :class:`SecretInfo`, which has no value. Writes are atomic (a temp file, fsync, rename), so a
rotation is either the old value or the new one, never half of each.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequest, NotFound
from ..fsutil import atomic_write, private_dir
from ..secretnames import validate_secret_name
from .models import SecretInfo, SecretRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Secret:
    info: SecretInfo
    value: str

    def __repr__(self) -> str:  # a traceback or a log line never shows the value
        return f"Secret({self.info.name!r}, hosts={self.info.hosts})"


class SecretStore:
    def __init__(self, directory: Path) -> None:
        self.directory = private_dir(directory)
        self._secrets: dict[str, Secret] = {}
        for path in sorted(directory.glob("*.json")):
            try:
                raw = json.loads(path.read_text())
                self._secrets[raw["name"]] = Secret(SecretInfo.model_validate(raw["info"]), raw["value"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("secret file %s is unreadable, skipped: %s", path.name, type(exc).__name__)

    def put(self, name: str, request: SecretRequest) -> tuple[SecretInfo, bool]:
        """Add ``name``, or rotate it (a new value and settings, the next request through the proxy uses them).
        The secret's info, and whether it existed."""
        try:
            validate_secret_name(name)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        old = self._secrets.get(name)
        now = time.time()
        info = SecretInfo(
            name=name, hosts=request.hosts, header=request.header, format=request.format, body=request.body,
            metadata=request.metadata, version=old.info.version + 1 if old else 1,
            created_at=old.info.created_at if old else now, updated_at=now,
        )  # fmt: skip
        record = {"name": name, "info": info.model_dump(mode="json"), "value": request.value}
        atomic_write(self._path(name), json.dumps(record).encode(), mode=0o600)
        self._secrets[name] = Secret(info, request.value)
        log.info("secret %s %s (bound to %s)", name, "rotated" if old else "added", ", ".join(info.hosts) or "no host")
        return info, old is not None

    def remove(self, name: str) -> SecretInfo:
        secret = self._get(name)
        self._path(name).unlink(missing_ok=True)
        del self._secrets[name]
        log.info("secret %s removed", name)
        return secret.info

    def info(self, name: str) -> SecretInfo:
        return self._get(name).info

    def list(self) -> list[SecretInfo]:
        return [self._secrets[name].info for name in sorted(self._secrets)]

    def get(self, name: str) -> Secret | None:
        """For the egress proxy only: the secret with its value, as it is now (None: removed)."""
        return self._secrets.get(name)

    def _get(self, name: str) -> Secret:
        secret = self._secrets.get(name)
        if secret is None:
            known = ", ".join(sorted(self._secrets)) or "none yet"
            raise NotFound(f"no secret named {name[:80]!r} (secrets: {known}); add one with `stasis secret add`")
        return secret

    def _path(self, name: str) -> Path:
        return self.directory / f"{validate_secret_name(name)}.json"  # a name never leaves the directory
