"""A FILESYSTEM checkpoint of a sandbox with fast storage: its writable layer lives in its kernel, so the agent
packs how its root differs from the image (:mod:`stasis.guest.changes`) into a tar on its /tmp, which is on the
sandbox's disk, and the host unpacks it as the checkpoint's upper layer.

The archive is written by the sandbox: untrusted. The host makes the file itself and holds it open before the
agent is asked to fill it, and reads only that descriptor: whatever a process of the sandbox renames over the
name meanwhile, the host never opens a file by a name the sandbox chose. The bytes are checked and unpacked by
:mod:`stasis.guest.untar`, which never writes through a link; its only device is a whiteout (0:0)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tarfile
from pathlib import Path

from ...errors import BackendError
from ...fsutil import no_space
from ...guest import protocol as P
from ...guest import untar
from ...guest.client import GuestChannel
from . import fifos

IMAGE_MOUNT = "/opt/stasis-image"  # the image's files, read-only, in a sandbox with fast storage
SKIP = [*fifos.SKIP, IMAGE_MOUNT, "/etc/resolv.conf"]  # mounts: not the sandbox's own files
FILESTORE_PREFIX = ".gvisor.filestore."  # runsc's backing file of the layer, at the top of the host's layer


async def read_layer(channel: GuestChannel, tmp: Path, dest: Path, limit: int) -> None:
    """The sandbox's writable layer as files in ``dest`` (an overlay upper layer over its image); its files may
    add up to ``limit`` bytes (its disk's size: the archive cannot hold more, unless it lies)."""
    name = f".stasis-changes-{secrets.token_hex(8)}.tar"
    fd = _create_in(tmp, name)
    try:
        await channel.call(P.PackChanges(image=IMAGE_MOUNT, archive=f"/tmp/{name}", skip=SKIP), timeout=3600)
        await asyncio.to_thread(unpack, fd, dest, limit)  # what it holds open; whatever the name now holds
    except (OSError, tarfile.TarError) as exc:
        raise no_space(BackendError(f"unpacking the files of {channel.label} failed: {exc}"), dest) from exc
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            _unlink_in(tmp, name)  # never opened: removing a link or a file the sandbox put there follows nothing


def unpack(fd: int, dest: Path, limit: int) -> None:
    """The archive behind ``fd`` (read from its start; the descriptor stays open) as the layer ``dest``."""
    if (size := os.fstat(fd).st_size) > limit + (64 << 20):  # a sparse file, written past the sandbox's disk
        raise BackendError(f"the sandbox's archive of its files is refused: {size} bytes, more than its disk holds")
    with os.fdopen(os.dup(fd), "rb") as archive:
        archive.seek(0)
        try:
            with untar.open_archive(archive) as tar:
                dest.mkdir(parents=True, exist_ok=True)
                untar.extract(tar, dest, links="any", whiteouts=True, owners=True, max_bytes=limit)
        except (untar.UnsafeArchive, OverflowError) as exc:
            raise BackendError(f"the sandbox's archive of its files is refused: {exc}") from exc


def _create_in(directory: Path, name: str) -> int:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _unlink_in(directory: Path, name: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
