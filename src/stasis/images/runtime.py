"""A python3 of stasis's own for images that have none (busybox, alpine/musl, distroless, node).

The agent is a Python program; it runs on the image's python3 when there is one. Otherwise the
sandbox gets this: the default image's interpreter with its standard library and the shared
libraries they link, glibc's loader included, as a read-only tree mounted at
``/opt/stasis-python``. It is started through that loader (``ld-linux-x86-64.so.2 --library-path
/opt/stasis-python/lib``), so it never uses the image's libraries and the image's files are never
touched; the commands the agent starts are the image's own, and see none of it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

from .. import procs
from ..errors import BackendError, ImageNotFound
from ..fsutil import fsync_dir

log = logging.getLogger(__name__)

MOUNT_POINT = "/opt/stasis-python"
RUNTIME_FORMAT = 1
SKIPPED_STDLIB = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "__pycache__",
                  "site-packages", "dist-packages", "config-3.11-x86_64-linux-gnu")  # fmt: skip
VERSION = "3.11"


def argv_prefix() -> list[str]:
    """How to start the bundled interpreter inside a sandbox."""
    return [f"{MOUNT_POINT}/lib/ld-linux-x86-64.so.2", "--library-path", f"{MOUNT_POINT}/lib",
            f"{MOUNT_POINT}/bin/python{VERSION}"]  # fmt: skip


def agent_runtime(images: Path) -> Path:
    """The runtime tree, made once from the default image (about 30 MB)."""
    from .recipe import RECIPES

    built = images / RECIPES["default"].key
    if not (built / "image.json").exists():
        raise ImageNotFound(
            "an image without python3 runs the agent on stasis's own python, made from the default image: "
            "build it first (`stasis image build default`, or make setup)"
        )
    source = built / "rootfs"
    key = hashlib.sha256(f"{RUNTIME_FORMAT}:{built.name}".encode()).hexdigest()[:12]
    final = images / f"agent-python-{key}"
    if (final / "bin" / f"python{VERSION}").exists():
        return final
    staging = images / f".agent-python-{key}-{os.getpid()}"  # ends with the pid: the image store sweeps it
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _build(source, staging)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(staging, final)
        fsync_dir(images)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("made the agent's own python at %s", final)
    return final


def _build(source: Path, dest: Path) -> None:
    (dest / "bin").mkdir()
    (dest / "lib").mkdir()
    python = source / f"usr/bin/python{VERSION}"
    shutil.copy2(python, dest / "bin" / python.name)
    shutil.copytree(source / f"usr/lib/python{VERSION}", dest / f"lib/python{VERSION}", symlinks=True,
                    ignore=shutil.ignore_patterns(*SKIPPED_STDLIB))  # fmt: skip
    script = f"for f in /usr/bin/python{VERSION} /usr/lib/python{VERSION}/lib-dynload/*.so; do ldd $f; done"
    result = procs.run_blocking(["chroot", str(source), "/bin/sh", "-c", script], timeout=120)
    if result.returncode != 0:
        raise BackendError(f"listing the libraries of the default image's python failed: {result.output}")
    listed = result.stdout.decode(errors="replace")
    libraries = {part for line in listed.splitlines() for part in line.split() if part.startswith("/")}
    for library in sorted(libraries):
        real = Path(os.path.realpath(source / library.lstrip("/")))
        if not real.is_relative_to(source):  # an absolute link resolved on the host: resolve it in the image
            real = source / os.path.realpath(library).lstrip("/")
        shutil.copy2(real, dest / "lib" / Path(library).name)
    for directory in (dest, *dest.rglob("*")):
        if directory.is_dir():
            os.chmod(directory, 0o755)
