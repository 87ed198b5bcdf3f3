"""Host-side file helpers of the microVM backend: qcow2 overlays and sparse copies."""

from __future__ import annotations

from pathlib import Path

from ... import procs
from ...errors import BackendError


async def create_overlay(base: Path, disk: Path) -> None:
    argv = ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base), str(disk)]
    result = await procs.run(argv, timeout=60)
    if result.returncode != 0:
        raise BackendError(f"qemu-img could not create {disk}: {result.output}")


async def copy_file(source: Path, dest: Path) -> None:
    """Copy keeping holes (guest RAM is mostly untouched); reflinks where the file system allows.

    `cp` without -L copies a link as the link it is: nothing a guest wrote is followed on the host."""
    result = await procs.run(["cp", "--sparse=always", "--reflink=auto", "-P", str(source), str(dest)], timeout=3600)
    if result.returncode != 0:
        raise BackendError(f"copying {source} to {dest} failed: {result.output}")
