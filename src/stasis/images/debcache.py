"""Debian packages kept across image builds on one host, so a second recipe (or a rebuild) downloads only what the
first did not: mmdebstrap's own sync-in / sync-out hooks (its manual's way without a caching proxy).

Every build copies the cache into its tree before apt runs and copies what apt then holds out to a directory of its
own; only after a build succeeds are those packages moved in, one rename each, so two builds at once never write the
same file and a build cut off leaves nothing half-written. apt may take a cached package whose size matches the
suite's index without hashing it again, so the cache is trusted as the images themselves are: it is used only while
it is this user's own directory, mode 0700 and no link (else the build downloads everything, and the log says why).
The cache keeps at most ``LIMIT`` bytes, oldest out first. mmdebstrap's clean-up removes the packages from the image
itself: an image is the same with or without the cache. ``stasis`` never needs it: deleting it is always safe.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import stat
from pathlib import Path

log = logging.getLogger(__name__)

LIMIT = 3 << 30  # bytes: the three built-in recipes' packages, with room for a new point release
ARCHIVES = "/var/cache/apt/archives"


def private(cache: Path) -> bool:
    """Make the cache if it is missing; whether it is ours alone (see the module's docstring)."""
    try:
        cache.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(cache)
    except OSError as exc:
        log.warning("not using the package cache %s: %s", cache, exc)
        return False
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        log.warning("not using the package cache %s: it must be a directory of this user's, mode 0700", cache)
        return False
    if found.st_mode & 0o077:  # ours, made under an open umask (or by an older stasis): closed now
        os.chmod(cache, 0o700)
    return True


def hooks(cache: Path, out: Path) -> list[str]:
    """mmdebstrap's arguments that read the cache into a build and write what it downloaded to ``out``; none
    (every package downloaded) if the cache is not private."""
    if not private(cache):
        return []
    return [
        "--skip=essential/unlink",  # the essential packages stay in the archives too, for sync-out to see
        f'--setup-hook=mkdir -p "$1"{ARCHIVES}/',
        f"--setup-hook=sync-in {shlex.quote(str(cache))} {ARCHIVES}/",
        f"--customize-hook=sync-out {ARCHIVES} {shlex.quote(str(out))}",
    ]


def keep(cache: Path, out: Path) -> None:
    """Move the packages a finished build held (``out``) into the cache, then trim it to ``LIMIT``. The cache is
    only a saving: whatever goes wrong here is logged, never fails the build."""
    try:
        if private(cache):
            _keep(cache, out)
    except OSError as exc:
        log.warning("the package cache %s was not updated: %s", cache, exc)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _keep(cache: Path, out: Path) -> None:
    for deb in out.glob("*.deb") if out.is_dir() else []:
        if deb.is_file() and not deb.is_symlink():
            os.replace(deb, cache / deb.name)
            os.utime(cache / deb.name)  # used now: the last to go
    kept = 0
    for _, size, deb in sorted(_found(cache), reverse=True):  # the newest first
        if kept + size > LIMIT:
            deb.unlink(missing_ok=True)
        else:
            kept += size
    log.info("the package cache holds %d MB", kept >> 20)


def _found(cache: Path) -> list[tuple[float, int, Path]]:
    """The cache's packages: (last used, size, path); one that another build trims meanwhile is left out."""
    found = []
    for deb in cache.glob("*.deb"):
        with contextlib.suppress(FileNotFoundError):
            seen = os.lstat(deb)
            if stat.S_ISREG(seen.st_mode):
                found.append((seen.st_mtime, seen.st_size, deb))
    return found
