"""Volumes: named directory trees on the host with a lifecycle of their own, mounted into sandboxes (gVisor).

    volumes/NAME/volume.json         its record
    volumes/NAME/data/               its files (what a sandbox sees at its mount path)
    volumes/.snapshots/ID/           a snapshot: snapshot.json and data/, read only

A volume outlives every sandbox that mounts it; several sandboxes may mount one at once and see each other's
writes (gVisor revalidates a shared mount's files on each access, so a file one writes, another reads: no
locking between them is given beyond what POSIX gives one host). A snapshot is a copy of the files (regular
files, directories, links) walked by directory descriptors: on a file system with reflinks (XFS, btrfs) no data
is copied; on ext4 it is a full copy of the data's extents (measured in benchmarks/volumes.py). Everything under
``data/`` was written by a sandbox: the host never follows a link in it, and removes trees with GNU rm (which
walks by descriptors, however deep).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import hostpath, volume_files
from .errors import BackendError, InvalidRequest, NameTaken, NoSpace, NotFound, VolumeNotFound, echo
from .fsutil import atomic_write, fsync_dir
from .validation import NAME_PATTERN
from .volume_models import VolumeInfo, VolumeSnapshotInfo

log = logging.getLogger(__name__)

SNAPSHOTS = ".snapshots"
SNAPSHOT_ID = re.compile(r"vs-[0-9a-z]{12}")
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
FICLONE = 0x40049409  # ioctl: share a file's data (a reflink)
MAX_DEPTH = 256  # directories a snapshot follows down
MAX_ENTRIES = 2_000_000  # entries a snapshot copies
RESERVE = 1 << 30  # bytes of the host's disk a snapshot always leaves free
DATA_MODE = 0o1777  # every user of every sandbox may write it, as /tmp (the host side is in a 0700 home)


class Volumes:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    # -- volumes

    def _dir(self, name: str) -> Path:
        return hostpath.child(self.directory, name, "volume name", NAME_PATTERN)

    def data(self, name: str) -> Path:
        """The host directory a sandbox mounts."""
        self.get(name)
        return self._dir(name) / "data"

    def get(self, name: str) -> VolumeInfo:
        path = self._dir(name) / "volume.json"
        try:
            return VolumeInfo.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise VolumeNotFound(f"no volume named {echo(name)}; `stasis volume ls` lists them") from None
        except ValidationError:
            raise InvalidRequest(f"volume {name}'s record is unreadable; remove the volume") from None

    def size(self, name: str) -> int:
        return tree_size(self._dir(name) / "data")

    def list(self) -> list[VolumeInfo]:
        found = []
        for record in sorted(self.directory.glob("*/volume.json")) if self.directory.is_dir() else []:
            with contextlib.suppress(NotFound, InvalidRequest):
                found.append(self.get(record.parent.name))
        return found

    def create(self, name: str, from_snapshot: str | None = None) -> VolumeInfo:
        final = self._dir(name)
        if final.exists():
            raise NameTaken(f"a volume named {echo(name)} exists; pick another name or remove it first")
        source = self.snapshot(from_snapshot) if from_snapshot else None
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self.directory / f".new-{name}-{os.getpid()}"
        if staging.exists():
            remove_tree(staging)
        staging.mkdir()
        try:
            if source is None:
                (staging / "data").mkdir()
            else:
                _copy_tree(self._snapshot_dir(source.id) / "data", staging / "data")
            os.chmod(staging / "data", DATA_MODE)
            info = VolumeInfo(name=name, created_at=time.time(), from_snapshot=source.id if source else None,
                              incarnation=secrets.token_hex(8))  # fmt: skip
            atomic_write(staging / "volume.json", info.model_dump_json().encode(), mode=0o600)
            os.rename(staging, final)
            fsync_dir(self.directory)
        except BaseException:
            remove_tree(staging)
            raise
        return info

    def remove(self, name: str) -> None:
        """The volume and its files (the caller checked no sandbox mounts it); its snapshots stay."""
        self.get(name)
        doomed = self.directory / f".removed-{name}-{secrets.token_hex(4)}-{os.getpid()}"
        os.rename(self._dir(name), doomed)  # gone at once, even if deleting its files is cut off
        fsync_dir(self.directory)
        remove_tree(doomed)

    # -- snapshots

    def _snapshots(self) -> Path:
        return self.directory / SNAPSHOTS

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        return hostpath.child(self._snapshots(), snapshot_id, "snapshot id", SNAPSHOT_ID)

    def take_snapshot(self, name: str, snapshot_name: str | None = None) -> VolumeSnapshotInfo:
        """A read-only copy of the volume's files now: taken file by file while sandboxes may write (each file
        whole, the tree not at one instant; suspend its sandboxes first for that)."""
        self.get(name)
        if snapshot_name and any(s.name == snapshot_name for s in self.snapshots()):
            raise NameTaken(f"a volume snapshot named {echo(snapshot_name)} exists; pick another name")
        snapshot_id = "vs-" + "".join(secrets.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(12))
        self._snapshots().mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self._snapshots() / f".new-{snapshot_id}-{os.getpid()}"
        staging.mkdir()
        try:
            _copy_tree(self._dir(name) / "data", staging / "data")
            info = VolumeSnapshotInfo(id=snapshot_id, volume=name, name=snapshot_name, created_at=time.time(),
                                      size_bytes=tree_size(staging / "data"))  # fmt: skip
            atomic_write(staging / "snapshot.json", info.model_dump_json().encode(), mode=0o600)
            os.rename(staging, self._snapshot_dir(snapshot_id))
            fsync_dir(self._snapshots())
        except BaseException:
            remove_tree(staging)
            raise
        return info

    def snapshot(self, ref: str) -> VolumeSnapshotInfo:
        """A snapshot by its id or its name."""
        if SNAPSHOT_ID.fullmatch(ref):
            with contextlib.suppress(FileNotFoundError, ValidationError):
                return VolumeSnapshotInfo.model_validate_json((self._snapshot_dir(ref) / "snapshot.json").read_bytes())
        named = [s for s in self.snapshots() if s.name == ref]
        if not named:
            raise VolumeNotFound(f"no volume snapshot {echo(ref)}; `stasis volume snapshots` lists them")
        return named[0]

    def snapshots(self, volume: str | None = None) -> list[VolumeSnapshotInfo]:
        found = []
        for record in sorted(self._snapshots().glob("vs-*/snapshot.json")) if self._snapshots().is_dir() else []:
            with contextlib.suppress(ValidationError, OSError):
                info = VolumeSnapshotInfo.model_validate_json(record.read_bytes())
                if info.id == record.parent.name and volume in (None, info.volume):
                    found.append(info)
        return sorted(found, key=lambda s: s.created_at)

    def remove_snapshot(self, ref: str) -> None:
        info = self.snapshot(ref)
        doomed = self._snapshots() / f".removed-{info.id}-{os.getpid()}"
        os.rename(self._snapshot_dir(info.id), doomed)
        remove_tree(doomed)

    # -- files

    def files(self, name: str, path: str = "/", depth: int = 1) -> list[dict[str, Any]]:
        """The entries of directory ``path`` of the volume, to ``depth`` (see :mod:`stasis.volume_files`)."""
        return volume_files.list_dir(self.data(name), path, depth)

    def sweep(self) -> None:
        """Creates, snapshots and removals cut off by a daemon's death leave hidden entries: they go."""
        for parent in (self.directory, self._snapshots()):
            for stale in parent.glob(".*-*") if parent.is_dir() else []:
                try:
                    remove_tree(stale)
                except BackendError as exc:  # logged: a start never fails on what a cut-off removal left
                    log.warning("could not sweep %s: %s", stale, exc)


def _copy_tree(source: Path, dest: Path) -> None:
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
