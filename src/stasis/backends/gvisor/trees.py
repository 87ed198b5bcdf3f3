"""Host-side trees of a gVisor sandbox: its writable layer copied, its directory removed, the resolv.conf of
networked sandboxes."""

from __future__ import annotations

import os
from pathlib import Path

from ... import procs
from ...errors import BackendError
from ...fsutil import atomic_write, no_space
from ...network.namespaces import GATEWAY_ADDRESS


def resolv_conf(home: Path) -> Path:
    """The /etc/resolv.conf of every networked sandbox: the daemon's resolver at its gateway."""
    path = home / "net" / "resolv.conf"
    text = f"nameserver {GATEWAY_ADDRESS}\noptions timeout:2 attempts:2\n".encode()
    if not path.exists() or path.read_bytes() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)
    return path


async def copy_tree(source: Path, dest: Path, skip_prefix: str | None = None) -> None:
    """Copy a sandbox's writable layer (whiteouts and xattrs included); reflinks where the fs allows; its top-level
    entries named ``skip_prefix``... left out.

    `cp -a` never follows a link and copies FIFOs and devices as such, without opening them."""
    dest.mkdir(parents=True, exist_ok=True)
    if skip_prefix is None:
        sources = [f"{source}/."]
    else:
        sources = [str(source / name) for name in sorted(os.listdir(source)) if not name.startswith(skip_prefix)]
        if not sources:
            return
    result = await procs.run(["cp", "-a", "--reflink=auto", *sources, str(dest)], timeout=3600)
    if result.returncode != 0:
        raise no_space(BackendError(f"copying {source} to {dest} failed: {result.output}"), dest)


def remove_tree(path: Path) -> None:
    """Remove a sandbox's directory; never follows a link inside it (shutil.rmtree does not)."""
    import shutil

    if path.exists():
        shutil.rmtree(path)
