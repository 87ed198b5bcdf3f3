"""The sandbox's writable root: a host overlayfs over the shared, read-only image."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from ...errors import BackendError

MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def is_mounted(target: Path) -> bool:
    wanted = str(target)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == wanted for line in mounts)


def mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    if is_mounted(target):
        return
    for directory in (upper, work, target):
        directory.mkdir(parents=True, exist_ok=True)
    options = f"lowerdir={lower},upperdir={upper},workdir={work}".encode()
    if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, options) != 0:
        err = ctypes.get_errno()
        raise BackendError(f"mounting the sandbox root at {target} failed: {os.strerror(err)}")


def unmount(target: Path) -> None:
    if not is_mounted(target):
        return
    if _libc.umount2(str(target).encode(), 0) != 0:
        err = ctypes.get_errno()
        if err != errno.EBUSY or _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
            raise BackendError(f"unmounting {target} failed: {os.strerror(ctypes.get_errno() or err)}")
