"""Host-side file helpers of the microVM backend: qcow2 overlays and sparse copies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ... import procs
from ...errors import BackendError, InvalidRequest


async def create_overlay(base: Path, disk: Path, size_mb: int) -> None:
    """A qcow2 of ``size_mb`` over ``base``; the guest grows its file system to fill it."""
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk), f"{size_mb}M"]
    result = await procs.run(argv, timeout=60)
    if result.returncode != 0:
        raise BackendError(f"qemu-img could not create {disk}: {result.output}")


async def _info(disk: Path) -> dict[str, Any]:
    result = await procs.run(["qemu-img", "info", "--output=json", "-U", str(disk)], timeout=60)
    if result.returncode != 0:
        raise BackendError(f"qemu-img could not read {disk}: {result.output}")
    return json.loads(result.stdout)


async def disk_size_mb(disk: Path) -> int:
    return int((await _info(disk))["virtual-size"]) >> 20


async def backing_file(disk: Path) -> Path:
    """The base disk a qcow2 overlay names (by path)."""
    described = await _info(disk)
    backing = described.get("full-backing-filename") or described.get("backing-filename")
    if not backing:
        raise BackendError(f"{disk} names no base disk")
    return Path(backing)


async def rebase(disk: Path, base: Path) -> None:
    """Point the overlay at another copy of its base (the same bytes, maybe another path): header only."""
    if await backing_file(disk) == base:
        return
    argv = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk)]
    result = await procs.run(argv, timeout=60)
    if result.returncode != 0:
        raise BackendError(f"qemu-img could not point {disk} at {base}: {result.output}")


async def grow_disk(disk: Path, size_mb: int) -> None:
    """Make a (stopped) VM's disk ``size_mb`` big; the guest grows its file system at boot. Never shrinks."""
    current = await disk_size_mb(disk)
    if size_mb < current:
        raise InvalidRequest(f"the disk of this checkpoint is {current} MiB; disk_mb cannot be less")
    if size_mb > current:
        result = await procs.run(["qemu-img", "resize", "-q", "-f", "qcow2", str(disk), f"{size_mb}M"], timeout=60)
        if result.returncode != 0:
            raise BackendError(f"qemu-img could not resize {disk}: {result.output}")


async def copy_file(source: Path, dest: Path) -> None:
    """Copy keeping holes (guest RAM is mostly untouched); reflinks where the file system allows.

    `cp` without -L copies a link as the link it is: nothing a guest wrote is followed on the host."""
    result = await procs.run(["cp", "--sparse=always", "--reflink=auto", "-P", str(source), str(dest)], timeout=3600)
    if result.returncode != 0:
        raise BackendError(f"copying {source} to {dest} failed: {result.output}")
