"""Debian packages kept across image builds on one host, so a second recipe (or a rebuild) downloads only what the
first did not: mmdebstrap's own sync-in / sync-out hooks (its manual's way without a caching proxy).

Every build copies the cache into its tree before apt runs and copies what apt then holds out to a directory of its
own; only after a build succeeds are those packages moved in, one rename each, so two builds at once never write the
same file and a build cut off leaves nothing half-written. apt checks each cached package against the suite's
index before it installs it, as it would a download. The cache keeps at most ``LIMIT`` bytes, oldest out first.
mmdebstrap's clean-up removes the packages from the image itself: an image is the same with or without the cache.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

LIMIT = 3 << 30  # bytes: the three built-in recipes' packages, with room for a new point release
ARCHIVES = "/var/cache/apt/archives"


def hooks(cache: Path, out: Path) -> list[str]:
    """mmdebstrap's arguments that read the cache into a build and write what it downloaded to ``out``."""
    cache.mkdir(parents=True, exist_ok=True)
    return [
        "--skip=essential/unlink",  # the essential packages stay in the archives too, for sync-out to see
        f'--setup-hook=mkdir -p "$1"{ARCHIVES}/',
        f"--setup-hook=sync-in {shlex.quote(str(cache))} {ARCHIVES}/",
        f"--customize-hook=sync-out {ARCHIVES} {shlex.quote(str(out))}",
    ]


def keep(cache: Path, out: Path) -> None:
    """Move the packages a finished build held (``out``) into the cache, then trim it to ``LIMIT``."""
    for deb in out.glob("*.deb") if out.is_dir() else []:
        if deb.is_file() and not deb.is_symlink():
            os.replace(deb, cache / deb.name)
            os.utime(cache / deb.name)  # used now: the last to go
    shutil.rmtree(out, ignore_errors=True)
    debs = sorted((p for p in cache.glob("*.deb") if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)
    kept = 0
    for deb in debs:
        if kept + deb.stat().st_size > LIMIT:
            deb.unlink(missing_ok=True)
        else:
            kept += deb.stat().st_size
    log.info("the package cache holds %d MB", kept >> 20)
