"""The volume store on btrfs: one file system in a sparse file of the home, mounted by the daemon over
``volumes/`` (in its own mount namespace, :mod:`stasis.mountns`; gone with it, found again by a daemon that joins
it). A volume's files are a subvolume:

- a snapshot is a read-only snapshot of it and a fork a writable snapshot of that: no data is copied, the blocks
  are shared until one side writes them, so both take milliseconds whatever the volume holds;
- its size limit is its qgroup's limit on the bytes it refers to: past it a write in the sandbox fails with
  EDQUOT ("Disk quota exceeded"), and nothing else on the host fills up;
- its size is its qgroup's count, not a walk of its files.

Used where the daemon runs as root and the kernel has btrfs (checked by :func:`unusable`), unless
``STASIS_VOLUME_STORE=copy``; otherwise volumes are plain directories (:mod:`stasis.volume_copy`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

from .errors import BackendError, InvalidRequest
from .volume_copy import remove_tree

log = logging.getLogger(__name__)

SUBVOLUME_INODE = 256  # a btrfs subvolume's root directory always has this inode number
DEFAULT_MAX_SIZE = 256 << 30  # the sparse file's size: at most this, and at most half the host's free disk
MIN_SIZE = 1 << 30
MOUNT_OPTIONS = "loop,nosuid,nodev,discard=async"  # discard: a file removed in a volume frees the host's disk


def unusable() -> str | None:
    """Why this host cannot keep volumes on btrfs, or None if it can."""
    if os.environ.get("STASIS_VOLUME_STORE", "").lower() == "copy":
        return "STASIS_VOLUME_STORE=copy asks for plain directories"
    if os.geteuid() != 0:
        return "the daemon does not run as root (a loop mount needs it)"
    missing = [tool for tool in ("mkfs.btrfs", "btrfs", "mount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install btrfs-progs)"
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "btrfs" not in filesystems.split() and subprocess.run(["modprobe", "btrfs"], capture_output=True).returncode:
        return "the kernel has no btrfs"
    return None


class BtrfsDisk:
    """Volumes' files as subvolumes of one btrfs file system, kept in ``image`` and mounted at ``directory``."""

    kind = "btrfs"

    def __init__(self, directory: Path, image: Path) -> None:
        self.directory = directory
        self.image = image
        self._lock = threading.Lock()
        self._mounted = False

    def ready(self, create: bool) -> bool:
        """Mount the file system (made first, with ``create``, if it does not exist); whether it is mounted."""
        with self._lock:
            if self._mounted or self._is_mounted():
                self._mounted = True
                return True
            if not self.image.exists():
                if not create:
                    return False
                self._make()
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            _run(["mount", "-t", "btrfs", "-o", MOUNT_OPTIONS, str(self.image), str(self.directory)],
                 f"mounting the volume store {self.image}")  # fmt: skip
            os.chmod(self.directory, 0o700)
            _run(["btrfs", "quota", "enable", str(self.directory)], "enabling quotas on the volume store")
            self._mounted = True
            log.info("volume store: btrfs in %s, mounted at %s", self.image, self.directory)
            return True

    def _make(self) -> None:
        free = shutil.disk_usage(self.image.parent)
        wanted = int(os.environ.get("STASIS_VOLUME_STORE_GB", "0")) << 30 or min(DEFAULT_MAX_SIZE, free.free // 2)
        if wanted < MIN_SIZE:
            raise BackendError(f"the host has too little free disk for a volume store ({free.free >> 20} MiB free "
                               f"in {self.image.parent}); free some, or set STASIS_VOLUME_STORE_GB")  # fmt: skip
        staging = self.image.with_name(f".{self.image.name}.new")
        staging.unlink(missing_ok=True)
        with open(staging, "wb") as sparse:
            sparse.truncate(wanted)
        os.chmod(staging, 0o600)
        _run(["mkfs.btrfs", "-q", "-L", "stasis-volumes", str(staging)], "making the volume store")
        os.rename(staging, self.image)
        log.info("made the volume store %s: btrfs in a sparse file of %d GiB", self.image, wanted >> 30)

    def _is_mounted(self) -> bool:
        target = str(self.directory)
        with open("/proc/self/mounts") as mounts:
            return any([f.replace("\\040", " ") for f in line.split()[1:3]] == [target, "btrfs"] for line in mounts)

    # -- what the store asks of a disk

    def empty(self, path: Path) -> None:
        _run(["btrfs", "subvolume", "create", str(path)], "making the volume's subvolume")

    def clone(self, source: Path, dest: Path, read_only: bool) -> None:
        flags = ["-r"] if read_only else []
        _run(["btrfs", "subvolume", "snapshot", *flags, str(source), str(dest)], "snapshotting the volume")

    def remove(self, path: Path) -> None:
        """``path``: a subvolume, or a directory of the store's own holding subvolumes (never what a sandbox
        wrote: a sandbox's files are inside a subvolume, deleted whole)."""
        if _is_subvolume(path):
            _run(["btrfs", "subvolume", "delete", str(path)], "deleting the volume's subvolume")
            return
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                if _is_subvolume(child):
                    _run(["btrfs", "subvolume", "delete", str(child)], "deleting the volume's subvolume")
        remove_tree(path)

    def size(self, path: Path) -> int:
        """Bytes the subvolume refers to (shared with its snapshots or not), as its qgroup counts them."""
        try:
            done = subprocess.run(["btrfs", "qgroup", "show", "-rf", "--raw", str(path)], capture_output=True,
                                  text=True, timeout=60)  # fmt: skip
        except subprocess.TimeoutExpired:
            log.warning("btrfs qgroup show of %s took over a minute; its size is reported as 0", path)
            return 0
        for line in done.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0].startswith("0/") and fields[1].isdigit():
                return int(fields[1])
        return 0

    def limit(self, path: Path, max_bytes: int | None) -> None:
        value = "none" if max_bytes is None else str(max_bytes)
        _run(["btrfs", "qgroup", "limit", value, str(path)], "setting the volume's size limit")

    def sweep(self) -> None:
        """The qgroups of deleted subvolumes."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(["btrfs", "qgroup", "clear-stale", str(self.directory)], capture_output=True, timeout=60)


def _is_subvolume(path: Path) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_ino == SUBVOLUME_INODE


def _run(argv: list[str], what: str) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise BackendError(f"{what} took over 5 minutes; `{' '.join(argv[:3])}` did not finish") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip()[-400:]
        if "Disk quota exceeded" in detail:
            raise InvalidRequest(f"{what} failed: the volume is at its size limit ({detail})")
        raise BackendError(f"{what} failed: {detail}")
