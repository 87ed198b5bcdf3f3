"""The sandbox's writable root: a host overlayfs over the shared, read-only image."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from ...errors import BackendError

MNT_DETACH = 2
MS_BIND = 4096
MS_SHARED = 1 << 20
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


def share(directory: Path) -> None:
    """Make ``directory`` (where sandboxes' disks and roots are mounted) a shared mount: a bind of itself.

    This happens in the daemon's own mount namespace (:mod:`stasis.mountns`), which the host's never sees. A
    mount namespace the daemon's children make (``ip netns exec``, runsc's gofer, our own for networked
    sandboxes) starts with copies of every mount; were they private, those copies would keep a suspended
    sandbox's disk mounted (its loop device busy) for as long as that namespace lives. Under a shared mount,
    the copies are peers or slaves and an unmount here reaches them too."""
    directory.mkdir(parents=True, exist_ok=True)
    path = str(directory).encode()
    if not is_mounted(directory) and _libc.mount(path, path, None, MS_BIND, None) != 0:
        raise BackendError(f"bind-mounting {directory} onto itself failed: {os.strerror(ctypes.get_errno())}")
    if _libc.mount(None, path, None, MS_SHARED, None) != 0:
        raise BackendError(f"making {directory} a shared mount failed: {os.strerror(ctypes.get_errno())}")


def unshare_if_unused(directory: Path) -> None:
    """Undo :func:`share` when no sandbox is mounted below ``directory`` any more (a daemon stopping)."""
    prefix = f"{directory}/"
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1].startswith(prefix) for line in mounts):
            return
    unmount(directory)
