"""Directories as tar streams, on the SDK's side of ``upload_dir`` / ``download_dir``."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from ..errors import FileError, InvalidRequest
from ..guest import untar


def pack(local: str | Path) -> bytes:
    """``local`` (a directory) as an uncompressed tar, its contents at the archive's root."""
    source = Path(local)
    if not source.is_dir():
        raise InvalidRequest(f"{source} is not a directory; upload_dir sends a directory (write_file sends a file)")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(source, arcname=".")
    return buffer.getvalue()


def unpack(data: bytes, local: str | Path, replace: bool = False) -> Path:
    """Extract a tar as directory ``local``: beside it first, then renamed into place (whole or not at all)."""
    dest = Path(local).absolute()
    if dest.exists() and not replace:
        raise FileError(f"{dest} exists; pass replace=True to put the directory there")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stasis-", dir=dest.parent))
    try:
        try:  # the sandbox made it: no link may lead out of the destination, nothing written through one
            with untar.open_archive(io.BytesIO(data)) as tar:
                untar.extract(tar, staging, links="inside", case_insensitive=sys.platform in ("darwin", "win32"))
        except untar.UnsafeArchive as exc:
            raise InvalidRequest(f"the sandbox's directory was not unpacked: {exc}") from exc
        old = None
        if os.path.lexists(dest):
            old = dest.with_name(f".{dest.name}.stasis-old")
            os.rename(dest, old)
        os.rename(staging, dest)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest
