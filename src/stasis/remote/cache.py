"""A local cache of downloaded chunks, bounded in size, least recently used first out."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from .. import hostpath

log = logging.getLogger(__name__)


class ChunkCache:
    def __init__(self, root: Path, limit_bytes: int) -> None:
        self.root = root
        self.limit = limit_bytes
        self._lock = threading.Lock()
        self._size: int | None = None

    def _path(self, sha: str) -> Path:
        return hostpath.child(self.root / sha[:2], sha, "piece hash", hostpath.SHA256)

    def get(self, sha: str) -> bytes | None:
        path = self._path(sha)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        os.utime(path)  # most recently used
        return data

    def put(self, sha: str, data: bytes) -> None:
        if self.limit <= 0 or len(data) > self.limit:
            return
        path = self._path(sha)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{sha}.{threading.get_ident()}")
        partial.write_bytes(data)  # no fsync: a cache lost in a crash is only fetched again
        partial.rename(path)
        with self._lock:
            self._size = self._scan()[0] if self._size is None else self._size + len(data)
            if self._size > self.limit:
                self._evict()

    def usage(self) -> tuple[int, int]:
        """(bytes, chunks) held now."""
        with self._lock:
            size, count = self._scan()
            self._size = size
            return size, count

    def _scan(self) -> tuple[int, int]:
        files = [p for p in self.root.glob("*/*") if not p.name.startswith(".")]
        return sum(p.stat().st_size for p in files if p.exists()), len(files)

    def _evict(self) -> None:
        entries = []
        for path in self.root.glob("*/*"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            entries.append((stat.st_mtime, stat.st_size, path))
        entries.sort()
        size = sum(e[1] for e in entries)
        target = self.limit * 9 // 10  # make room for more than one chunk at a time
        for _, nbytes, path in entries:
            if size <= target:
                break
            path.unlink(missing_ok=True)
            size -= nbytes
        self._size = size
        log.info("remote cache evicted down to %d bytes (limit %d)", size, self.limit)
