"""Durable file-system helpers: nothing is ever half-written, and a full disk is said so."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
from pathlib import Path

from .errors import NoSpace

HEADROOM = 64 << 20  # bytes left free beyond what an operation writes: the store and logs need some too
NO_SPACE_TEXT = ("no space left on device", "disk quota exceeded", "database or disk is full")  # any case


def check_free_space(directory: Path, needed: int, what: str) -> None:
    """Refuse (NoSpace) before writing ``needed`` bytes where they would not fit."""
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    if needed + HEADROOM > free:
        raise NoSpace(
            f"{what} needs about {(needed + HEADROOM) >> 20} MiB free on {directory}, but only {free >> 20} MiB "
            "are: free disk space (`stasis df`; `stasis checkpoints rm`, `stasis rm` of sandboxes you do not need) "
            "and try again",
            needed=needed + HEADROOM,
            free=free,
        )


def no_space(exc: BaseException, where: Path) -> BaseException:
    """``exc`` as a NoSpace naming ``where`` if a full disk caused it; else ``exc`` itself."""
    full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if full or any(text in str(exc).lower() for text in NO_SPACE_TEXT):
        return NoSpace(
            f"the disk holding {where} is full ({exc}); free disk space (`stasis df`; `stasis checkpoints rm`) "
            "and try again; the sandbox was left as it was"
        )
    return exc


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    _fsync(path, os.O_DIRECTORY)


def fsync_file(path: Path) -> None:
    _fsync(path, os.O_NOFOLLOW)


def fsync_tree(path: Path) -> None:
    """fsync every regular file and directory below ``path`` (inclusive).

    The tree may hold what a sandbox wrote: links are never followed and nothing but
    regular files and directories is opened (a FIFO would block, a link could lead
    anywhere on the host)."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = _open_regular(os.path.join(root, name))
            if fd is not None:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(Path(root))


def _open_regular(path: str) -> int | None:
    """An fd of ``path`` if it is a regular file (opened without following links or blocking), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:  # a symlink (ELOOP), gone, or unreadable: nothing of ours to flush
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def private_dir(path: Path) -> Path:
    """A directory only the daemon's user reads (0700), made if missing, tightened if it was not."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp name, fsync, rename over ``path``, fsync the directory."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_dir(path.parent)


def tree_bytes(path: Path, seen: set[tuple[int, int]] | None = None) -> int:
    """Disk space taken by the regular files below ``path`` (allocated blocks: holes cost nothing), each
    file once however many hard links it has here (an image's build layers share theirs), as `du` counts.
    Pass one ``seen`` to several calls to count a file shared between their trees once in all.

    Stays on ``path``'s file system: a sandbox's mounted root (its image) is not its own bytes."""
    total, seen = 0, set() if seen is None else seen
    try:
        device = os.lstat(path).st_dev
    except OSError:
        return 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if _same_device(os.path.join(root, d), device)]
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def _same_device(path: str, device: int) -> bool:
    try:
        return os.lstat(path).st_dev == device
    except OSError:
        return False


def connect_sqlite(path: Path) -> sqlite3.Connection:
    """A SQLite connection for a journal: autocommit (explicit transactions), WAL, fsync on commit."""
    db = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    return db
