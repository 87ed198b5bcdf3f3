"""A FILESYSTEM checkpoint of a sandbox with fast storage: its writable layer lives in its kernel, so the agent
packs how its root differs from the image (:mod:`stasis.guest.changes`) into a tar on its /tmp, which is on the
sandbox's disk, and the host unpacks it as the checkpoint's upper layer.

The archive is written by the sandbox: untrusted. It is opened without following a link, and every member is
checked before anything is written: no path leaves the layer or goes through a link, a link made by hard link
stays inside, and the only device is a whiteout (0:0)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
import tarfile
from pathlib import Path

from ...errors import BackendError
from ...fsutil import no_space
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ...guest.files import unsafe_member
from . import fifos

IMAGE_MOUNT = "/opt/stasis-image"  # the image's files, read-only, in a sandbox with fast storage
SKIP = [*fifos.SKIP, IMAGE_MOUNT, "/etc/resolv.conf"]  # mounts: not the sandbox's own files
FILESTORE_PREFIX = ".gvisor.filestore."  # runsc's backing file of the layer, at the top of the host's layer


async def read_layer(channel: GuestChannel, tmp: Path, dest: Path) -> None:
    """The sandbox's writable layer as files in ``dest`` (an overlay upper layer over its image)."""
    name = f".stasis-changes-{secrets.token_hex(8)}.tar"
    try:
        await channel.call(P.PackChanges(image=IMAGE_MOUNT, archive=f"/tmp/{name}", skip=SKIP), timeout=3600)
        await asyncio.to_thread(unpack, tmp, name, dest)
    except (OSError, tarfile.TarError) as exc:
        raise no_space(BackendError(f"unpacking the files of {channel.label} failed: {exc}"), dest) from exc
    finally:
        with contextlib.suppress(OSError):
            _unlink_in(tmp, name)


def unpack(directory: Path, name: str, dest: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as archive:
        if not stat.S_ISREG(os.fstat(archive.fileno()).st_mode):
            raise BackendError(f"the sandbox's archive of its files, /tmp/{name}, is not a regular file")
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            members = tar.getmembers()
            links: set[str] = set()
            for member in members:
                if (why := unsafe(member, links)) is not None:
                    raise BackendError(f"the sandbox's archive of its files is refused: {why}")
            dest.mkdir(parents=True, exist_ok=True)
            tar.extractall(dest, members=members, numeric_owner=True, filter="fully_trusted")


def unsafe(member: tarfile.TarInfo, links: set[str]) -> str | None:
    if whiteout(member) or member.isfifo():  # no device to the host: only the path is checked
        return unsafe_member(_as_file(member), links)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        return f"archive member {member.name!r} is neither a file, a directory, a link, a FIFO nor a whiteout"
    return unsafe_member(member, links)


def whiteout(member: tarfile.TarInfo) -> bool:
    return member.ischr() and member.devmajor == 0 and member.devminor == 0


def _as_file(member: tarfile.TarInfo) -> tarfile.TarInfo:
    plain = tarfile.TarInfo(member.name)
    plain.type = tarfile.REGTYPE
    return plain


def _unlink_in(directory: Path, name: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.unlink(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
