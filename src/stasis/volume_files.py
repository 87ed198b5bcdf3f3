"""Files of a volume, reached from the host: every path is walked from the volume's root one directory at a time
with ``O_NOFOLLOW``, so a link a sandbox left in the volume (``ln -s /etc x``, or a directory swapped for a link
mid-walk) never leads the host outside it. A write goes to a temporary file in its directory and is renamed over
the name (a link there is replaced, never written through).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import secrets
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import Conflict, InvalidRequest, NoSpace, NotFound, echo

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ENTRIES = 10_000  # entries one listing returns
MAX_DEPTH = 32
CHUNK = 1 << 20
KINDS = {stat.S_IFDIR: "directory", stat.S_IFLNK: "symlink", stat.S_IFREG: "file"}


def parts_of(path: str) -> list[str]:
    """``path`` (absolute or not, inside the volume) as its components; ``..`` is refused, not resolved."""
    if "\0" in path or len(path) > 4096:
        raise InvalidRequest(f"{echo(path)} is not a path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidRequest(f"{echo(path)} leaves the volume ('..' in it)")
    return parts


@contextlib.contextmanager
def directory(root: Path, parts: list[str], make: tuple[int, int, int] | None = None) -> Iterator[int]:
    """A descriptor of directory ``parts`` under ``root``; ``make`` (uid, gid, mode): missing ones are made."""
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            made = False
            if make is not None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)  # owner and mode set through the descriptor opened below
                    made = True
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise NotFound(f"{'/' + '/'.join(parts)} does not exist in the volume") from None
            except OSError:  # ELOOP (a link) or ENOTDIR
                raise NotFound(f"{'/' + '/'.join(parts)} is not a directory of the volume") from None
            os.close(fd)
            fd = child
            if made and make is not None:  # a directory inside the volume, whatever was swapped in: harmless
                os.fchown(fd, make[0], make[1])
                os.fchmod(fd, make[2])
        yield fd
    finally:
        os.close(fd)


def _entry(name: str, path: str, info: os.stat_result, target: str | None) -> dict[str, Any]:
    def when(seconds: float) -> str:
        return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()

    entry = {"name": name, "type": KINDS.get(stat.S_IFMT(info.st_mode), "unknown"), "path": path,
             "size": info.st_size, "mode": stat.S_IMODE(info.st_mode), "uid": info.st_uid, "gid": info.st_gid,
             "atime": when(info.st_atime), "mtime": when(info.st_mtime), "ctime": when(info.st_ctime)}  # fmt: skip
    return entry | ({"target": target} if target is not None else {})


def _stat_at(fd: int, name: str, path: str) -> dict[str, Any]:
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        raise NotFound(f"{echo(path)} does not exist in the volume") from None
    target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
    return _entry(name, path, info, target)


def stat_path(root: Path, path: str) -> dict[str, Any]:
    parts = parts_of(path)
    if not parts:
        return _entry("", "/", os.stat(root, follow_symlinks=False), None)
    with directory(root, parts[:-1]) as fd:
        return _stat_at(fd, parts[-1], "/" + "/".join(parts))


def list_dir(root: Path, path: str, depth: int = 1) -> list[dict[str, Any]]:
    """Entries of directory ``path`` and, to ``depth``, of the directories below it (links never followed)."""
    parts = parts_of(path)
    found: list[dict[str, Any]] = []
    with directory(root, parts) as fd:
        _walk(fd, "/" + "/".join(parts), min(max(depth, 1), MAX_DEPTH), found)
    return found


def _walk(fd: int, prefix: str, depth: int, found: list[dict[str, Any]]) -> None:
    names = []
    with os.scandir(fd) as entries:  # read no further than a listing may return
        for entry in entries:
            names.append(entry.name)
            if len(found) + len(names) > MAX_ENTRIES:
                raise InvalidRequest(f"{prefix} holds more than {MAX_ENTRIES} entries at this depth; list less deep")
    for name in sorted(names):
        with contextlib.suppress(FileNotFoundError):
            entry = _stat_at(fd, name, f"{prefix.rstrip('/')}/{name}")
            found.append(entry)
            if depth > 1 and entry["type"] == "directory":
                with contextlib.suppress(OSError):
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                    try:
                        _walk(child, entry["path"], depth - 1, found)
                    finally:
                        os.close(child)


def read(root: Path, path: str) -> Iterator[bytes]:
    """A regular file's bytes, streamed (opened now: a missing file or a link is refused before any byte)."""
    parts = parts_of(path)
    if not parts:
        raise InvalidRequest("the volume's root is a directory, not a file")
    with directory(root, parts[:-1]) as parent:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        except FileNotFoundError:
            raise NotFound(f"{echo(path)} does not exist in the volume") from None
        except OSError:
            raise InvalidRequest(f"{echo(path)} is not a file (a link is not followed)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidRequest(f"{echo(path)} is not a regular file")
    return _chunks(fd)


def _chunks(fd: int) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def write(root: Path, path: str, chunks: Iterator[bytes], owner: tuple[int, int, int], parents: bool) -> dict[str, Any]:
    """``chunks`` as file ``path`` (``owner``: uid, gid, mode), replacing a file or link of that name."""
    parts = parts_of(path)
    if not parts:
        raise InvalidRequest("write a file inside the volume, not its root")
    uid, gid, mode = owner
    with directory(root, parts[:-1], (uid, gid, 0o755) if parents else None) as parent:
        temporary = f".stasis-{secrets.token_hex(6)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=parent)  # fmt: skip
        try:
            with _full_said(path), os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                os.fchown(f.fileno(), uid, gid)
                os.fchmod(f.fileno(), mode)
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.stat(parts[-1], dir_fd=parent, follow_symlinks=False).st_mode):
                    raise Conflict(f"{echo(path)} is a directory; remove it first")
            os.rename(temporary, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=parent)
            raise
        return _stat_at(parent, parts[-1], "/" + "/".join(parts))


@contextlib.contextmanager
def _full_said(path: str) -> Iterator[None]:
    """A full volume (its size limit, or its store's disk) as a NoSpace that says so, not an OSError's 500."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise NoSpace(
            f"the volume is full ({os.strerror(exc.errno)}): {echo(path)} was not written; remove files from it or "
            "make a volume with a larger limit"
        ) from None


def make_dir(root: Path, path: str, owner: tuple[int, int, int], parents: bool) -> dict[str, Any]:
    parts = parts_of(path)
    if not parts:
        return stat_path(root, "/")
    uid, gid, mode = owner
    with directory(root, parts[:-1], (uid, gid, 0o755) if parents else None) as parent:
        try:
            os.mkdir(parts[-1], 0o700, dir_fd=parent)
        except FileExistsError:
            if not parents:
                raise Conflict(f"{echo(path)} exists already") from None
        else:  # through a descriptor: the new name may have been swapped for a link by now
            with contextlib.suppress(OSError):
                made = os.open(parts[-1], DIR_FLAGS, dir_fd=parent)
                try:
                    os.fchown(made, uid, gid)
                    os.fchmod(made, mode)
                finally:
                    os.close(made)
        return _stat_at(parent, parts[-1], "/" + "/".join(parts))


def remove(root: Path, path: str) -> None:
    """A file or link (never what it points to), or a directory with all below it."""
    parts = parts_of(path)
    if not parts:
        raise InvalidRequest("the volume's root cannot be removed (remove the volume)")
    with directory(root, parts[:-1]) as parent:
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            raise NotFound(f"{echo(path)} does not exist in the volume") from None
        if stat.S_ISDIR(info.st_mode):  # GNU rm walks by descriptors, however deep, never through a link
            done = subprocess.run(["rm", "-rf", "--one-file-system", "--", f"/proc/self/fd/{parent}/{parts[-1]}"],
                                  pass_fds=(parent,), capture_output=True, text=True)  # fmt: skip
            if done.returncode != 0:
                raise Conflict(f"removing {echo(path)} failed: {done.stderr.strip()[-300:]}")
        else:
            os.unlink(parts[-1], dir_fd=parent)


def change(root: Path, path: str, uid: int | None, gid: int | None, mode: int | None) -> dict[str, Any]:
    """Owner and mode of ``path``; a link's own owner (its mode means nothing)."""
    parts = parts_of(path)
    with directory(root, parts[:-1] if parts else []) as parent:
        name = parts[-1] if parts else "."
        info = os.stat(name, dir_fd=parent, follow_symlinks=False) if parts else os.fstat(parent)
        if stat.S_ISLNK(info.st_mode):
            os.chown(name, -1 if uid is None else uid, -1 if gid is None else gid, dir_fd=parent, follow_symlinks=False)
            return _stat_at(parent, name, "/" + "/".join(parts))
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        try:
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            if mode is not None:
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
        return stat_path(root, path)
