"""Volumes: named directory trees on the host with a lifecycle of their own, mounted into sandboxes (gVisor).

    volumes/NAME/volume.json         its record
    volumes/NAME/data/               its files (what a sandbox sees at its mount path)
    volumes/.snapshots/ID/           a snapshot: snapshot.json and data/, read only

A volume outlives every sandbox that mounts it; several sandboxes may mount one at once and see each other's
writes (gVisor revalidates a shared mount's files on each access, so a file one writes, another reads: no
locking between them is given beyond what POSIX gives one host).

Where the host allows (root, a kernel with btrfs), ``volumes/`` is a btrfs file system of its own
(:mod:`stasis.volume_btrfs`): ``data/`` is a subvolume, a snapshot and a fork take milliseconds and copy nothing,
and a volume may have a size limit. Elsewhere ``data/`` is a plain directory (:mod:`stasis.volume_copy`): a
snapshot copies the files, walked by directory descriptors, and a size limit is refused. Either way everything
under ``data/`` was written by a sandbox: the host never follows a link in it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from . import hostpath, volume_btrfs, volume_files
from .errors import BackendError, InvalidRequest, NameTaken, NotFound, VolumeNotFound, echo
from .fsutil import atomic_write, fsync_dir
from .validation import NAME_PATTERN
from .volume_btrfs import BtrfsDisk
from .volume_copy import CopyDisk
from .volume_models import VolumeInfo, VolumeSnapshotInfo

log = logging.getLogger(__name__)

SNAPSHOTS = ".snapshots"
SNAPSHOT_ID = re.compile(r"vs-[0-9a-z]{12}")
DATA_MODE = 0o1777  # every user of every sandbox may write it, as /tmp (the host side is in a 0700 home)


class Disk(Protocol):
    """How the store keeps files: btrfs subvolumes (:mod:`stasis.volume_btrfs`) or plain directories."""

    kind: str

    def ready(self, create: bool) -> bool: ...
    def empty(self, path: Path) -> None: ...
    def clone(self, source: Path, dest: Path, read_only: bool) -> None: ...
    def remove(self, path: Path) -> None: ...
    def size(self, path: Path) -> int: ...
    def limit(self, path: Path, max_bytes: int | None) -> None: ...
    def sweep(self) -> None: ...


def choose_disk(directory: Path, image: Path) -> Disk:
    """btrfs where the host allows it, for a home that has no store of plain directories already."""
    if image.exists():
        return BtrfsDisk(directory, image)
    if directory.is_dir() and any(directory.iterdir()):
        return CopyDisk(directory, "this home's volumes were made as plain directories")
    if why := volume_btrfs.unusable():
        log.info("volumes are plain directories (snapshots copy files, no size limits): %s", why)
        return CopyDisk(directory, why)
    return BtrfsDisk(directory, image)


class Volumes:
    def __init__(self, directory: Path, disk: Disk | None = None) -> None:
        self.directory = directory
        self.disk = disk or CopyDisk(directory)

    # -- volumes

    def _dir(self, name: str) -> Path:
        return hostpath.child(self.directory, name, "volume name", NAME_PATTERN)

    def data(self, name: str) -> Path:
        """The host directory a sandbox mounts."""
        self.get(name)
        return self._dir(name) / "data"

    def get(self, name: str) -> VolumeInfo:
        path = self._dir(name) / "volume.json"
        self.disk.ready(create=False)
        try:
            return VolumeInfo.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            raise VolumeNotFound(f"no volume named {echo(name)}; `stasis volume ls` lists them") from None
        except ValidationError:
            raise InvalidRequest(f"volume {name}'s record is unreadable; remove the volume") from None

    def size(self, name: str) -> int:
        return self.disk.size(self._dir(name) / "data")

    def list(self) -> list[VolumeInfo]:
        found = []
        if not self.disk.ready(create=False):
            return found
        for record in sorted(self.directory.glob("*/volume.json")):
            with contextlib.suppress(NotFound, InvalidRequest):
                found.append(self.get(record.parent.name))
        return found

    def create(
        self, name: str, from_snapshot: str | None = None, max_size_mb: int | None = None,
        fill: Callable[[Path], None] | None = None, incarnation: str | None = None, team: str | None = None,
    ) -> VolumeInfo:  # fmt: skip
        """A new volume: empty, a writable fork of a snapshot (which keeps the limit its volume had, unless
        ``max_size_mb`` says another), or holding the files ``fill`` makes (at a path that does not exist yet;
        within the limit already). ``incarnation``: a pulled copy keeps its volume's."""
        self.disk.ready(create=True)
        final = self._dir(name)
        if final.exists():
            raise NameTaken(f"a volume named {echo(name)} exists; pick another name or remove it first")
        source = self.snapshot(from_snapshot) if from_snapshot else None
        if source is not None:
            max_size_mb = source.max_size_mb if max_size_mb is None else max_size_mb
            team = source.team if team is None else team
        staging = self.directory / f".new-{name}-{secrets.token_hex(4)}"  # its own: creates of one name may race
        staging.mkdir()
        try:
            if source is None:
                self.disk.empty(staging / "data")
                self.disk.limit(staging / "data", _bytes(max_size_mb))
                if fill is not None:
                    _fill(staging / "data", fill)
            else:
                self.disk.clone(self._snapshot_dir(source.id) / "data", staging / "data", read_only=False)
                self.disk.limit(staging / "data", _bytes(max_size_mb))
            os.chmod(staging / "data", DATA_MODE)
            info = VolumeInfo(name=name, created_at=time.time(), from_snapshot=source.id if source else None,
                              incarnation=incarnation or secrets.token_hex(8), max_size_mb=max_size_mb,
                              team=team)  # fmt: skip
            atomic_write(staging / "volume.json", info.model_dump_json().encode(), mode=0o600)
            try:
                os.rename(staging, final)  # onto a directory another create made meanwhile: ENOTEMPTY
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise NameTaken(f"a volume named {echo(name)} was made meanwhile; pick another name") from None
                raise
            fsync_dir(self.directory)
        except BaseException:
            self.disk.remove(staging)
            raise
        return info

    def set_limit(self, name: str, max_size_mb: int | None) -> VolumeInfo:
        """Change the volume's size limit (None: none). A limit below what it holds stops further writes."""
        info = self.get(name)
        self.disk.limit(self._dir(name) / "data", _bytes(max_size_mb))
        info = info.model_copy(update={"max_size_mb": max_size_mb})
        atomic_write(self._dir(name) / "volume.json", info.model_dump_json().encode(), mode=0o600)
        return info

    @contextlib.contextmanager
    def frozen(self, name: str) -> Iterator[Path]:
        """The volume's files as a snapshot would take them, read only, for as long as the block runs."""
        self.get(name)
        self._snapshots().mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self._snapshots() / f".frozen-{name}-{secrets.token_hex(4)}"
        staging.mkdir()
        try:
            self.disk.clone(self._dir(name) / "data", staging / "data", read_only=True)
            yield staging / "data"
        finally:
            self.disk.remove(staging)

    def remove(self, name: str) -> None:
        """The volume and its files (the caller checked no sandbox mounts it); its snapshots stay."""
        self.get(name)
        doomed = self.directory / f".removed-{name}-{secrets.token_hex(4)}-{os.getpid()}"
        os.rename(self._dir(name), doomed)  # gone at once, even if deleting its files is cut off
        fsync_dir(self.directory)
        self.disk.remove(doomed)

    # -- snapshots

    def _snapshots(self) -> Path:
        return self.directory / SNAPSHOTS

    def _snapshot_dir(self, snapshot_id: str) -> Path:
        return hostpath.child(self._snapshots(), snapshot_id, "snapshot id", SNAPSHOT_ID)

    def snapshot_data(self, ref: str) -> Path:
        """A snapshot's files (read only: nothing changes them)."""
        return self._snapshot_dir(self.snapshot(ref).id) / "data"

    def take_snapshot(self, name: str, snapshot_name: str | None = None) -> VolumeSnapshotInfo:
        """A read-only copy of the volume's files now. On btrfs, of the whole tree at one instant; as plain
        directories, taken file by file while sandboxes may write (each file whole; suspend its sandboxes first
        for one instant)."""
        volume = self.get(name)
        if snapshot_name and any(s.name == snapshot_name for s in self.snapshots()):
            raise NameTaken(f"a volume snapshot named {echo(snapshot_name)} exists; pick another name")
        snapshot_id = "vs-" + "".join(secrets.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(12))
        self._snapshots().mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = self._snapshots() / f".new-{snapshot_id}-{os.getpid()}"
        staging.mkdir()
        try:
            self.disk.clone(self._dir(name) / "data", staging / "data", read_only=True)
            info = VolumeSnapshotInfo(id=snapshot_id, volume=name, name=snapshot_name, created_at=time.time(),
                                      size_bytes=self.disk.size(staging / "data"),
                                      max_size_mb=volume.max_size_mb, team=volume.team)  # fmt: skip
            atomic_write(staging / "snapshot.json", info.model_dump_json().encode(), mode=0o600)
            os.rename(staging, self._snapshot_dir(snapshot_id))
            fsync_dir(self._snapshots())
        except BaseException:
            self.disk.remove(staging)
            raise
        return info

    def snapshot(self, ref: str) -> VolumeSnapshotInfo:
        """A snapshot by its id or its name."""
        self.disk.ready(create=False)
        if SNAPSHOT_ID.fullmatch(ref):
            with contextlib.suppress(FileNotFoundError, ValidationError):
                return VolumeSnapshotInfo.model_validate_json((self._snapshot_dir(ref) / "snapshot.json").read_bytes())
        named = [s for s in self.snapshots() if s.name == ref]
        if not named:
            raise VolumeNotFound(f"no volume snapshot {echo(ref)}; `stasis volume snapshots` lists them")
        return named[0]

    def snapshots(self, volume: str | None = None) -> list[VolumeSnapshotInfo]:
        found = []
        if not self.disk.ready(create=False) or not self._snapshots().is_dir():
            return found
        for record in sorted(self._snapshots().glob("vs-*/snapshot.json")):
            with contextlib.suppress(ValidationError, OSError):
                info = VolumeSnapshotInfo.model_validate_json(record.read_bytes())
                if info.id == record.parent.name and volume in (None, info.volume):
                    found.append(info)
        return sorted(found, key=lambda s: s.created_at)

    def remove_snapshot(self, ref: str) -> None:
        info = self.snapshot(ref)
        doomed = self._snapshots() / f".removed-{info.id}-{os.getpid()}"
        os.rename(self._snapshot_dir(info.id), doomed)
        self.disk.remove(doomed)

    # -- files

    def files(self, name: str, path: str = "/", depth: int = 1) -> list[dict[str, Any]]:
        """The entries of directory ``path`` of the volume, to ``depth`` (see :mod:`stasis.volume_files`)."""
        return volume_files.list_dir(self.data(name), path, depth)

    def sweep(self) -> None:
        """Creates, snapshots and removals cut off by a daemon's death leave hidden entries: they go."""
        try:
            if not self.disk.ready(create=False):
                return
        except BackendError as exc:  # logged: a start never fails on the volume store; its calls say why
            log.error("the volume store could not be mounted: %s", exc)
            return
        for parent in (self.directory, self._snapshots()):
            for stale in parent.glob(".*-*") if parent.is_dir() else []:
                try:
                    self.disk.remove(stale)
                except BackendError as exc:  # logged: a start never fails on what a cut-off removal left
                    log.warning("could not sweep %s: %s", stale, exc)
        self.disk.sweep()


def _fill(data: Path, fill: Callable[[Path], None]) -> None:
    """``fill`` makes a tree beside nothing else inside ``data`` (a btrfs subvolume: nothing renames into one from
    outside), which then becomes ``data``: its entries moved up, its owner and mode kept."""
    incoming = data / f".stasis-incoming-{secrets.token_hex(8)}"
    fill(incoming)
    for entry in os.listdir(incoming):
        os.rename(incoming / entry, data / entry)
    made = os.lstat(incoming)
    os.chown(data, made.st_uid, made.st_gid)
    os.rmdir(incoming)


def _bytes(max_size_mb: int | None) -> int | None:
    return None if max_size_mb is None else max_size_mb << 20
