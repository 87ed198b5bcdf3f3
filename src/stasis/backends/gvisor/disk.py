"""A gVisor sandbox's own disk: a sparse ext4 file of ``disk_mb``, loop-mounted while the sandbox runs.

Its writable layer (the overlay's upper and work dirs) and its /tmp live on it, so a
sandbox that fills its disk gets ENOSPC inside and nothing else on the host does; `df`
inside shows its size. The file is sparse (thin provisioning): only what the sandbox writes costs host disk, so
the host must have room for what its sandboxes write; should the host's disk fill first,
writes inside fail with I/O errors (and its file system may turn read-only until it boots again).
The loop device is released whenever the disk is unmounted (suspended or stopped
sandboxes hold none): `mount -o loop` sets it to clear itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from pathlib import Path

from ... import procs
from ...errors import BackendError
from ...fsutil import fsync_dir
from . import mounts

log = logging.getLogger(__name__)

# Inode tables are left uninitialised (a fresh sparse file reads as zeros) and never zeroed in the
# background: otherwise a 10 GiB disk would cost ~160 MiB of written zeros on the host. The (small)
# journal is written out, so that committing it never needs new host blocks. `discard`: what the
# sandbox deletes is given back to the host (the file's blocks are punched out).
MKFS = (
    "mkfs.ext4", "-q", "-F", "-m", "0", "-L", "stasis-disk", "-J", "size=16",
    "-E", "lazy_itable_init=1,lazy_journal_init=0,nodiscard",
)  # fmt: skip
MOUNT_OPTIONS = "loop,noatime,noinit_itable,discard,errors=remount-ro"


async def create(image: Path, size_mb: int) -> None:
    """Make the disk file (sparse) with an empty ext4 on it; no-op if it exists."""
    if image.exists():
        return
    if shutil.which("mkfs.ext4") is None:
        raise BackendError("mkfs.ext4 is missing; install it with: apt-get install e2fsprogs (make setup does)")
    staging = image.with_name(f".{image.name}.new")
    staging.unlink(missing_ok=True)
    with open(staging, "wb") as f:
        f.truncate(size_mb << 20)
    result = await procs.run([*MKFS, str(staging)], timeout=120)
    if result.returncode != 0:
        staging.unlink(missing_ok=True)
        raise BackendError(f"mkfs.ext4 could not make a {size_mb} MiB disk at {image}: {result.output}")
    os.chmod(staging, 0o600)
    os.rename(staging, image)
    fsync_dir(image.parent)


async def attach(image: Path, target: Path) -> None:
    """Mount the disk at ``target`` (idempotent: it may still be mounted from before a daemon restart)."""
    if mounts.is_mounted(target):
        return
    target.mkdir(exist_ok=True)
    result = await procs.run(["mount", "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(target)], timeout=60)
    if result.returncode != 0:
        raise BackendError(
            f"mounting the sandbox's disk {image} failed: {result.output} "
            "(it needs a free loop device: `losetup -f` shows one)"
        )


def detach(target: Path) -> None:
    mounts.unmount(target)


def in_use(image: Path) -> bool:
    """Whether a loop device still backs onto the disk file."""
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if backing.read_text().strip().removesuffix(" (deleted)") == str(image):
                return True
    return False


async def released(image: Path, timeout: float = 30.0) -> None:
    """Wait until no loop device holds the disk: an unmount that found it busy detached it lazily, and
    until that file system is really gone it may still write to the file (its journal, its superblock)."""
    deadline = time.monotonic() + timeout
    while in_use(image):
        if time.monotonic() > deadline:
            raise BackendError(
                f"the disk {image} is still held by a loop device after {timeout:.0f}s "
                f"(processes whose mount namespace still has it: {holders(image.parent) or 'none'}); try again"
            )
        await asyncio.sleep(0.05)


def holders(directory: Path) -> list[str]:
    """``pid (command)``, one per mount namespace other than ours that has a mount under ``directory``."""
    prefix, own, seen, found = f" {directory}/", os.readlink("/proc/self/ns/mnt"), set(), []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            namespace = os.readlink(f"/proc/{entry}/ns/mnt") if entry.isdigit() else own
            if namespace in seen or namespace == own:
                continue
            seen.add(namespace)
            if prefix in Path(f"/proc/{entry}/mounts").read_text():
                found.append(f"{entry} ({Path(f'/proc/{entry}/comm').read_text().strip()})")
    return found


def fresh_dir(path: Path, mode: int) -> None:
    """An empty directory at ``path`` (what was there is removed without following any link in it)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir()
    os.chmod(path, mode)
