"""The daemon's own mount namespace: where sandboxes' disks and writable roots are mounted.

A mount namespace made on the host copies every mount the host has. Had the daemon mounted a sandbox's disk in
the host's namespace, any later ``unshare -m`` (util-linux makes the copies private) would keep the disk mounted
for as long as it lives, and the sandbox could not be suspended. So the daemon mounts them in a namespace of its
own: the host's namespace, and every namespace later made from it, never has them.

The namespace outlives the daemon that made it (running sandboxes' runsc processes live in it, and a daemon
restarted later must see their mounts): it is pinned by a bind mount of its file at ``runtime/mnt.ns``, in the
host's namespace, which a restarted daemon joins; a clean stop with no sandbox mounted unpins it. A host reboot
ends it (no mount survives one). Inside it, the mount that
holds the home is made a slave of the host's (the host's new mounts still come in, ours never go out), so the
sandboxes directory can be a shared mount there: namespaces the daemon's children make (runsc's gofer, ``ip
netns exec``) see a sandbox's unmount at once.

Joining a mount namespace must happen while the process has one thread: :func:`enter` runs first in
``stasis serve``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from pathlib import Path

from .errors import BackendError

log = logging.getLogger(__name__)

CLONE_NEWNS = 0x00020000
MS_BIND, MS_PRIVATE, MS_SLAVE = 4096, 1 << 18, 1 << 19
NSFS_MAGIC = 0x6E736673
_libc = ctypes.CDLL(None, use_errno=True)
_host: int | None = None  # the host's mount namespace, held open from enter() on
_released: set[Path] = set()  # pins this process let go of (release runs at shutdown, and again on the way out)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise BackendError(f"{what} failed: {os.strerror(ctypes.get_errno())} (the daemon must run as root)")


def _mount(source: str | None, target: str, flags: int) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), None, flags, None), f"mount of {target}")


def _setns(fd: int) -> None:
    _check(_libc.setns(fd, CLONE_NEWNS), "joining the daemon's mount namespace")


def pinned(pin: Path) -> bool:
    """Whether ``pin`` holds a mount namespace (a bind of a namespace file), not an empty file. Seen from the
    host's namespace: from the pinned namespace itself it is the file under the mount."""
    try:
        fd = os.open(pin, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        buffer = ctypes.create_string_buffer(120)  # struct statfs: f_type first
        return _libc.fstatfs(fd, buffer) == 0 and int.from_bytes(buffer.raw[:8], "little") == NSFS_MAGIC
    finally:
        os.close(fd)


def enter(pin: Path, home: Path) -> bool:
    """Join the namespace pinned at ``pin``, or make it; True if it was made now. Call while single-threaded."""
    global _host
    if os.geteuid() != 0:
        log.warning("not root: sandboxes' disks are mounted in the host's mount namespace")
        return False
    if len(os.listdir("/proc/self/task")) != 1:
        raise BackendError("the daemon must enter its mount namespace before it starts any thread")
    _host = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    if pinned(pin):
        fd = os.open(pin, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(fd)
        finally:
            os.close(fd)
        log.info("joined the sandboxes' mount namespace pinned at %s", pin)
        return False
    _private_dir(pin.parent)
    pin.touch(mode=0o600)
    _check(_libc.unshare(CLONE_NEWNS), "making the daemon's mount namespace")
    _mount(None, _mount_point_of(home), MS_SLAVE)  # nothing mounted below the home goes back to the host
    ours = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(_host)  # the pin is a mount of the host's namespace: made from there
        try:
            _mount(f"/proc/self/fd/{ours}", str(pin), MS_BIND)
        finally:
            _setns(ours)
    finally:
        os.close(ours)
    log.info("made the sandboxes' mount namespace, pinned at %s", pin)
    return True


def release(pin: Path, sandboxes: Path) -> None:
    """At a clean stop with no sandbox's disk mounted: unpin the namespace, which goes with the daemon. With one
    mounted (a sandbox left running), it stays pinned for the next daemon. The daemon has threads by now: the
    host's namespace is joined by a child of its own."""
    if _host is None or pin in _released:
        return
    prefix = f"{sandboxes}/"
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1].startswith(prefix) for line in mounts):
            return
    result = subprocess.run(
        ["nsenter", f"--mount=/proc/self/fd/{_host}", "umount", "--lazy", str(pin)],
        pass_fds=(_host,), capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode == 0:
        pin.unlink(missing_ok=True)  # seen from here, an empty file: the pin was the host's mount over it
        _released.add(pin)
    else:
        log.warning("could not unpin the sandboxes' mount namespace at %s: %s", pin, result.stderr.strip())


def _private_dir(directory: Path) -> None:
    """``directory`` as a private mount of its own: a namespace's pin below it never propagates anywhere."""
    directory.mkdir(parents=True, exist_ok=True)
    if _mount_point_of(directory) != str(directory):
        _mount(str(directory), str(directory), MS_BIND)
    _mount(None, str(directory), MS_PRIVATE)


def _mount_point_of(path: Path) -> str:
    """The mount point of the mount that holds ``path`` (the longest mount point above it)."""
    resolved, best = str(path.resolve()), "/"
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            point = line.split()[1].replace("\\040", " ")
            if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best = point
    return best
