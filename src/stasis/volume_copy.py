"""The volume store without a file system's help: copies walked by directory descriptors, trees removed and
measured by GNU rm and du. Everything under a volume's ``data/`` was written by a sandbox: the host never follows
a link in it."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BackendError, InvalidRequest, NoSpace, Unsupported

log = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
FICLONE = 0x40049409  # ioctl: share a file's data (a reflink)
MAX_DEPTH = 256  # directories a snapshot follows down
MAX_ENTRIES = 2_000_000  # entries a snapshot copies
RESERVE = 1 << 30  # bytes of the host's disk a snapshot always leaves free


def copy_tree(source: Path, dest: Path) -> None:
    """``source``'s files as ``dest`` (which must not exist), walked by directory descriptors opened with
    ``O_NOFOLLOW`` and checked to be what was listed: a directory a sandbox swaps for a link mid-copy is skipped,
    never followed. Regular files (shared with ``FICLONE`` where the file system can: reflinks), directories and
    links are copied with their owners, modes and times, hard links as hard links; FIFOs, sockets and device nodes
    are left out. An entry that vanishes or changes while it is copied is skipped. The copy stops, refused, before
    it would leave the host's disk less than RESERVE free, or past MAX_ENTRIES entries."""
    free = os.statvfs(dest.parent)
    copy = _Copy(dest, budget=free.f_bavail * free.f_frsize - RESERVE)
    src = os.open(source, DIR_FLAGS)
    try:
        os.mkdir(dest, 0o700)
        dst = os.open(dest, DIR_FLAGS)
        try:
            copy.directory(src, dst, "", 0)
            _same_owner_mode_times(src, dst)
        finally:
            os.close(dst)
    except OSError as exc:
        raise BackendError(f"copying the volume's files failed: {exc}") from None
    finally:
        os.close(src)


@dataclass
class _Copy:
    root: Path
    budget: int  # bytes the copy may still write
    entries: int = 0
    linked: dict[tuple[int, int], str] = field(default_factory=dict)  # a hard-linked file's first copy

    def directory(self, src: int, dst: int, relative: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"the volume nests directories deeper than {MAX_DEPTH}; a snapshot stops there")
        with os.scandir(src) as listing:
            for entry in listing:
                self.entries += 1
                if self.entries > MAX_ENTRIES:
                    raise InvalidRequest(f"the volume holds more than {MAX_ENTRIES} entries; a snapshot stops there")
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    self.entry(src, dst, entry.name, f"{relative}/{entry.name}", depth)

    def entry(self, src: int, dst: int, name: str, relative: str, depth: int) -> None:
        info = os.stat(name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
            os.chown(name, info.st_uid, info.st_gid, dir_fd=dst, follow_symlinks=False)
            return
        if not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
            return  # a FIFO, socket or device a sandbox made: not a volume's content
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1 and (info.st_dev, info.st_ino) in self.linked:
            os.link(self.root / self.linked[(info.st_dev, info.st_ino)], name, dst_dir_fd=dst)
            return
        flags = (DIR_FLAGS if stat.S_ISDIR(info.st_mode) else FILE_FLAGS) | os.O_NONBLOCK
        try:
            child = os.open(name, flags, dir_fd=src)
        except OSError:
            return  # gone or swapped since it was listed
        try:
            opened = os.fstat(child)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                return  # swapped between the listing and the open
            if stat.S_ISDIR(opened.st_mode):
                os.mkdir(name, 0o700, dir_fd=dst)
                made = os.open(name, DIR_FLAGS, dir_fd=dst)
                try:
                    self.directory(child, made, relative, depth + 1)
                    _same_owner_mode_times(child, made)
                finally:
                    os.close(made)
                return
            made = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
            try:
                self.budget -= _copy_bytes(child, made, opened.st_size, self.budget)
                _same_owner_mode_times(child, made)
            finally:
                os.close(made)
            if opened.st_nlink > 1:
                self.linked[(opened.st_dev, opened.st_ino)] = relative.lstrip("/")
        finally:
            os.close(child)


def _copy_bytes(src: int, dst: int, size: int, budget: int) -> int:
    """A reflink where the file system has them (XFS, btrfs: no data copied, 0 returned); else the data's extents
    only, so a sparse file stays sparse (a sandbox's 1 TB file of holes does not become 1 TB on the host). Returns
    the bytes written; refuses to write past ``budget``."""
    try:
        fcntl.ioctl(dst, FICLONE, src)
        return 0
    except OSError:
        pass
    offset = written = 0
    while offset < size:
        try:
            start = os.lseek(src, offset, os.SEEK_DATA)
            end = os.lseek(src, start, os.SEEK_HOLE)
        except OSError:  # ENXIO: only a hole is left (or the file shrank)
            break
        if end <= start:  # the region turned into a hole meanwhile
            offset = start + 1
            continue
        while start < end:
            if written + (end - start) > budget:
                raise NoSpace("a snapshot would leave the host's disk nearly full; free space, or remove snapshots")
            copied = os.copy_file_range(src, dst, end - start, start, start)
            if copied == 0:
                break
            start, written = start + copied, written + copied
        offset = max(end, offset + 1)
    os.ftruncate(dst, size)
    return written


def _same_owner_mode_times(src: int, dst: int) -> None:
    info = os.fstat(src)
    os.fchown(dst, info.st_uid, info.st_gid)
    os.fchmod(dst, stat.S_IMODE(info.st_mode))
    os.utime(dst, ns=(info.st_atime_ns, info.st_mtime_ns))


def remove_tree(path: Path) -> None:
    """``path`` and everything below it, however deep, never through a link (GNU rm walks by descriptors)."""
    done = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        raise BackendError(f"removing {path.name} failed: {done.stderr.strip()[-300:]}")


def tree_size(path: Path) -> int:
    """Bytes the files below ``path`` take (du walks by descriptors: a link a sandbox swaps in is not followed)."""
    try:
        done = subprocess.run(["du", "-s", "-x", "-B1", "--", str(path)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        log.warning("du of %s took over a minute; its size is reported as 0", path)
        return 0
    head = done.stdout.split("\t", 1)[0]
    return int(head) if head.isdigit() else 0


class CopyDisk:
    """Volumes' files as plain directories: a snapshot or fork copies the files (reflinked where the host's file
    system can), and a size limit cannot be kept."""

    kind = "copy"

    def __init__(self, directory: Path, why: str = "") -> None:
        self.directory = directory
        self.why = why  # why not btrfs

    def ready(self, create: bool) -> bool:
        if create:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.directory.is_dir()

    def empty(self, path: Path) -> None:
        path.mkdir()

    def clone(self, source: Path, dest: Path, read_only: bool) -> None:
        copy_tree(source, dest)

    def remove(self, path: Path) -> None:
        remove_tree(path)

    def size(self, path: Path) -> int:
        return tree_size(path)

    def limit(self, path: Path, max_bytes: int | None) -> None:
        if max_bytes is not None:
            raise Unsupported(
                "a volume's size limit needs the btrfs volume store, and this daemon keeps volumes as plain "
                f"directories ({self.why or 'a store of plain directories was made first'}); create it without one"
            )

    def sweep(self) -> None:
        pass
