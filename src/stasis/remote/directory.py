"""The remote store in a shared directory (``STASIS_REMOTE=file:///path``: one machine's fleet, or NFS): the
object store's interface over files. An object is a file written whole (a temporary name made with O_EXCL,
fsync, rename); its ETag is the MD5 of its bytes, as S3's for a single PUT; a document's conditional write holds
the store's lock (``flock``) while it compares and writes, so of nodes racing for a sandbox exactly one wins.

Whoever else writes the directory (another host of an NFS export) is untrusted: a key is checked component by
component, and every file and directory below the root is opened without following a symbolic link and must be
what it claims (a regular file of bounded size, a directory)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterator
from typing import Any

from ..errors import Conflict, InvalidRequest, NotFound, StoreUnreachable
from .config import RemoteConfig

PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # one component of a key: nothing else becomes a path
MAX_OBJECT = 1 << 30  # bytes: the largest object read whole (chunks and documents are far smaller)
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


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

    def _parts(self, name: str) -> list[str]:
        parts = self.key(name).split("/")
        if not all(PART.fullmatch(part) and part not in (".", "..") for part in parts):
            raise InvalidRequest("a key of the remote store may hold only letters, digits, '.', '_' and '-' parts")
        return parts

    @contextlib.contextmanager
    def _directory(self, parts: list[str], create: bool) -> Iterator[int | None]:
        """A descriptor of the directory ``parts`` below the root, walked without following links (None if absent
        and not ``create``)."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError, NotADirectoryError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    yield None
                    return
                except OSError as exc:  # ELOOP or ENOTDIR: a link or a file where a directory should be
                    raise StoreUnreachable(f"{self.url('/'.join(parts))}: not a directory of the store: {exc}") from exc
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    # ------------------------------------------------------------ whole objects

    def exists(self, name: str) -> bool:
        return self._fetch(name) is not None

    def etag(self, name: str) -> str | None:
        found = self._fetch(name)
        return None if found is None else found[1]

    def get(self, name: str) -> bytes:
        found = self._fetch(name)
        if found is None:
            raise NotFound(f"{self.url(name)} is not in the remote store")
        return found[0]

    def put(self, name: str, data: bytes) -> None:
        *folders, leaf = self._parts(name)
        with self._directory(folders, create=True) as fd:
            assert fd is not None
            temporary = f".{leaf[:200]}.{os.urandom(6).hex()}.tmp"
            out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as stream:
                    stream.write(data)
                    stream.flush()
                    os.fsync(stream.fileno())
                os.rename(temporary, leaf, src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temporary, dir_fd=fd)
                raise
            os.fsync(fd)

    def list(self, folder: str) -> list[str]:
        parts = self._parts(folder.rstrip("/")) if folder.strip("/") else []
        found: list[str] = []
        with self._directory(parts, create=False) as fd:
            if fd is not None:
                self._walk(fd, "/".join(parts), found)
        prefix = self.config.prefix
        return sorted(name[len(prefix) :] for name in found if name.startswith(prefix))

    def _walk(self, fd: int, at: str, found: list[str]) -> None:
        for entry in os.listdir(fd):
            if entry.startswith(".") or not PART.fullmatch(entry):
                continue
            mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
            if stat.S_ISREG(mode):
                found.append(f"{at}/{entry}" if at else entry)
            elif stat.S_ISDIR(mode):
                child = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
                try:
                    self._walk(child, f"{at}/{entry}" if at else entry, found)
                finally:
                    os.close(child)

    # ------------------------------------------------------------ documents with conditional writes

    def read_document(self, name: str) -> tuple[dict[str, Any], str] | None:
        found = self._fetch(name)
        if found is None:
            return None
        try:
            document = json.loads(found[0])
        except ValueError:
            raise StoreUnreachable(f"{self.url(name)} is not a JSON document") from None
        return document, found[1]

    def write_document(self, name: str, document: dict[str, Any], *, replacing: str | None) -> str:
        """Write if the key still holds the version ``replacing`` (an ETag), or, with None, if it is absent;
        Conflict if another writer got there first. Returns the new ETag."""
        body = json.dumps(document, indent=1, sort_keys=True).encode()
        with self._locked():
            current = self._fetch(name)
            if (current[1] if current else None) != replacing:
                raise Conflict(f"{self.url(name)} was changed by another node meanwhile")
            self.put(name, body)
        return _etag(body)

    def _fetch(self, name: str) -> tuple[bytes, str] | None:
        *folders, leaf = self._parts(name)
        with self._directory(folders, create=False) as fd:
            if fd is None:
                return None
            try:
                source = os.open(leaf, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise StoreUnreachable(f"could not read {self.url(name)}: {exc}") from exc
            with os.fdopen(source, "rb") as stream:
                info = os.fstat(stream.fileno())
                if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OBJECT:
                    raise StoreUnreachable(f"{self.url(name)} is not an object of the store")
                data = stream.read(MAX_OBJECT + 1)
        return data, _etag(data)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
