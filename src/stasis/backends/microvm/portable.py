"""A microVM's files on another node: its disk is a qcow2 overlay that names its base disk by path, and
its saved machine names the kernel and initramfs by path. The base travels by its ext4 file system's
UUID (key ``ext4-<uuid>``), once for every node; on arrival the overlay is pointed at this node's copy
(its own base with that UUID, or the one fetched) and the machine at this node's boot files."""

from __future__ import annotations

import json
from pathlib import Path

from ...fsutil import atomic_write
from ..base import External, Fetch
from .artifacts import BootFiles
from .files import backing_file, rebase

QCOW2 = "disk.qcow2"
PREFIX = "ext4-"


def ext4_uuid(path: Path) -> str:
    """The file system UUID in an ext4 superblock (bytes 0x68-0x78 of the superblock at 1024)."""
    with path.open("rb") as f:
        f.seek(1024 + 0x68)
        return f.read(16).hex()


async def externals(directory: Path) -> list[External]:
    disk = directory / QCOW2
    if not disk.exists():
        return []
    base = await backing_file(disk)
    return [External(PREFIX + ext4_uuid(base), base)]


async def rebind(directory: Path, needs: list[str], fetch: Fetch, cache: Path, boot: BootFiles | None) -> None:
    for key in needs:
        if not key.startswith(PREFIX) or not (directory / QCOW2).exists():
            continue
        own = [base for base in cache.glob("base*.ext4") if PREFIX + ext4_uuid(base) == key]
        await rebase(directory / QCOW2, own[0] if own else await fetch(key))
    _relocate_boot_files(directory, boot)


def _relocate_boot_files(directory: Path, boot: BootFiles | None) -> None:
    """A saved machine names its kernel and initramfs by path: point them at this node's copies of the same
    boot build (a restore checks the rest: QEMU build, kernel present)."""
    path = directory / "vm.json"
    if not path.exists() or boot is None:
        return
    stored = json.loads(path.read_text())
    machine = stored["machine"]
    for field, mine in (("kernel", boot.kernel), ("initramfs", boot.initramfs)):
        if Path(machine[field]).parent.name == mine.parent.name:  # boot-RELEASE-KEY: the same build
            machine[field] = str(mine)
    atomic_write(path, json.dumps(stored, indent=1).encode())
