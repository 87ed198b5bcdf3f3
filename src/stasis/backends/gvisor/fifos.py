"""Named pipes a sandbox made: gVisor keeps them in its memory, never in the host's writable layer, so a
FILESYSTEM checkpoint (a copy of that layer) would lose them. The agent lists them; they are made in the
checkpoint's copy. The list comes from the sandbox: its paths are made only inside the copy, step by step
without following a link."""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import stat
from pathlib import Path

from ...errors import Unsupported
from ...guest import protocol as P
from ...guest.client import GuestChannel

log = logging.getLogger(__name__)

SKIP = ["/proc", "/sys", "/dev", "/tmp", "/run", "/opt/stasis", "/opt/stasis-python"]  # not the saved layer


async def listed(channel: GuestChannel) -> list[P.Fifo]:
    try:
        return (await channel.call(P.ListFifos(skip=SKIP), timeout=300)).fifos
    except Unsupported:  # an agent from before this operation (a sandbox restored from long ago)
        log.warning("the agent in %s cannot list named pipes: the checkpoint has none", channel.label)
        return []


def add(fifos: list[P.Fifo], files: Path, lower: Path) -> None:
    """Make each FIFO in ``files`` (an overlay upper layer over ``lower``); a directory made for one takes the
    mode and owner the image gives it, as overlayfs would show it."""
    for fifo in fifos:
        parts = posixpath.normpath(fifo.path).split("/")[1:]
        if not parts or not parts[-1] or ".." in parts:
            continue
        fd = os.open(files, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for depth, part in enumerate(parts[:-1]):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    _like(lower.joinpath(*parts[: depth + 1]), part, fd)
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError:  # a link or a file where a directory should be: not ours to follow
                    break
                os.close(fd)
                fd = child
            else:
                _make(fifo, parts[-1], fd)
        finally:
            os.close(fd)


def _like(source: Path, name: str, fd: int) -> None:
    with contextlib.suppress(OSError):
        st = os.lstat(source)
        if stat.S_ISDIR(st.st_mode):
            os.chown(name, st.st_uid, st.st_gid, dir_fd=fd, follow_symlinks=False)
            os.chmod(name, stat.S_IMODE(st.st_mode), dir_fd=fd)


def _make(fifo: P.Fifo, name: str, fd: int) -> None:
    try:
        os.mkfifo(name, 0o600, dir_fd=fd)
    except FileExistsError:
        return  # something is there already (it was copied): leave it
    os.chown(name, fifo.uid, fifo.gid, dir_fd=fd, follow_symlinks=False)
    os.chmod(name, stat.S_IMODE(fifo.mode), dir_fd=fd)
