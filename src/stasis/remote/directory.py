"""The remote store in a shared directory (``STASIS_REMOTE=file:///path``: one machine's fleet, or NFS): the
object store's interface over files. An object is a file written whole (a temporary name, fsync, rename);
its ETag is the SHA-256 of its bytes; a document's conditional write holds the store's lock (``flock``) while
it compares and writes, so of nodes racing for a sandbox exactly one wins, as with S3's If-Match."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import Conflict, InvalidRequest, NotFound, StoreUnreachable
from ..fsutil import atomic_write
from .config import RemoteConfig

PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # one component of a key: nothing else becomes a path


class DirectoryStore:
    def __init__(self, config: RemoteConfig) -> None:
        assert config.directory is not None
        self.config = config
        self.root = config.directory
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StoreUnreachable(f"the store's directory {self.root} cannot be made: {exc}") from exc

    def key(self, name: str) -> str:
        return self.config.prefix + name

    def url(self, name: str) -> str:
        return f"file://{self.root}/{self.key(name)}"

    def _path(self, name: str) -> Path:
        parts = self.key(name).split("/")
        if not all(PART.fullmatch(part) and part not in (".", "..") for part in parts):
            raise InvalidRequest(f"{name[:80]!r} is not a key of the remote store")
        return self.root.joinpath(*parts)

    # ------------------------------------------------------------ whole objects

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def etag(self, name: str) -> str | None:
        found = self._fetch(name)
        return None if found is None else found[1]

    def get(self, name: str) -> bytes:
        found = self._fetch(name)
        if found is None:
            raise NotFound(f"{self.url(name)} is not in the remote store")
        return found[0]

    def put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data, mode=0o600)

    def list(self, folder: str) -> list[str]:
        base = self.root / self.config.prefix if self.config.prefix else self.root
        start = self._path(folder.rstrip("/")) if folder.strip("/") else base
        if not start.is_dir():
            return []
        return sorted(str(p.relative_to(base)) for p in start.rglob("*") if p.is_file() and not p.name.startswith("."))

    # ------------------------------------------------------------ documents with conditional writes

    def read_document(self, name: str) -> tuple[dict[str, Any], str] | None:
        found = self._fetch(name)
        return None if found is None else (json.loads(found[0]), found[1])

    def write_document(self, name: str, document: dict[str, Any], *, replacing: str | None) -> str:
        """Write if the key still holds the version ``replacing`` (an ETag), or, with None, if it is absent;
        Conflict if another writer got there first. Returns the new ETag."""
        body = json.dumps(document, indent=1, sort_keys=True).encode()
        with self._locked():
            current = self._fetch(name)
            if (current[1] if current else None) != replacing:
                raise Conflict(f"{self.url(name)} was changed by another node meanwhile")
            self.put(name, body)
        return hashlib.sha256(body).hexdigest()

    def _fetch(self, name: str) -> tuple[bytes, str] | None:
        try:
            data = self._path(name).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StoreUnreachable(f"could not read {self.url(name)}: {exc}") from exc
        return data, hashlib.sha256(data).hexdigest()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
