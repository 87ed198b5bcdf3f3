"""Built images, cached by recipe hash under the image directory.

An image is a directory ``<name>-<hash>/`` holding ``rootfs/`` (never modified
after the build: sandboxes stack a writable layer on top) and ``image.json``.
A build happens under a temporary name and is renamed into place when complete,
so a crashed build never looks like an image.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from ..errors import BackendError, ImageNotFound, InvalidRequest
from ..fsutil import atomic_write, fsync_dir, tree_bytes
from .recipe import RECIPES, Recipe

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str], None]


class ImageInfo(BaseModel):
    name: str
    key: str
    digest: str
    packages: list[str]
    suite: str
    size_bytes: int
    built_at: float
    build_seconds: float
    path: str


class ImageStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def recipe(self, name: str) -> Recipe:
        recipe = RECIPES.get(name)
        if recipe is None:
            raise InvalidRequest(f"unknown image {name!r}; known images: {', '.join(sorted(RECIPES))}")
        return recipe

    def get(self, name: str) -> ImageInfo:
        recipe = self.recipe(name)
        meta = self.directory / recipe.key / "image.json"
        if not meta.exists():
            raise ImageNotFound(
                f"image {name!r} is not built yet; run `stasis image build {name}` (make setup builds 'default')",
                image=name,
            )
        return ImageInfo.model_validate_json(meta.read_text())

    def rootfs(self, name: str) -> Path:
        return Path(self.get(name).path) / "rootfs"

    def rootfs_by_key(self, key: str) -> Path:
        """The exact build a sandbox was made from: a rebuilt recipe must not change a sandbox's files."""
        path = self.directory / key / "rootfs"
        if not (self.directory / key / "image.json").exists():
            raise ImageNotFound(f"image {key} that this sandbox was created from is gone from {self.directory}")
        return path

    def list(self) -> list[ImageInfo]:
        images = []
        if self.directory.exists():
            for meta in sorted(self.directory.glob("*/image.json")):
                images.append(ImageInfo.model_validate_json(meta.read_text()))
        return images

    def build(self, name: str, progress: ProgressCallback | None = None, force: bool = False) -> ImageInfo:
        """Build the image for recipe ``name`` unless a build of the same recipe exists."""
        recipe = self.recipe(name)
        final = self.directory / recipe.key
        if (final / "image.json").exists() and not force:
            return self.get(name)
        if shutil.which("mmdebstrap") is None:
            raise BackendError(
                "mmdebstrap not found on PATH; install it (`apt-get install mmdebstrap`) or run `make setup`"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        staging = self.directory / f".build-{recipe.key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        started = time.monotonic()
        argv = ["mmdebstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}"]
        argv += [recipe.suite, str(staging / "rootfs")]
        if mirror := os.environ.get("STASIS_APT_MIRROR"):
            argv.append(mirror)
        log.info("building image %s: %s", recipe.key, " ".join(argv))
        try:
            self._run_build(argv, progress)
            # Mount points and the agent's directory, so runsc never has to create them in the image.
            for sub in ("proc", "sys", "dev", "tmp", "root", "opt/stasis"):
                (staging / "rootfs" / sub).mkdir(parents=True, exist_ok=True)
            # Host keys made by openssh-server's install would be shared by every sandbox: each makes its own.
            for key in (staging / "rootfs" / "etc" / "ssh").glob("ssh_host_*"):
                key.unlink()
            info = ImageInfo(
                name=recipe.name,
                key=recipe.key,
                digest=recipe.digest,
                packages=sorted(recipe.packages),
                suite=recipe.suite,
                size_bytes=tree_bytes(staging / "rootfs"),
                built_at=time.time(),
                build_seconds=time.monotonic() - started,
                path=str(final),
            )
            atomic_write(staging / "image.json", info.model_dump_json(indent=2).encode())
            if final.exists():
                shutil.rmtree(final)
            os.rename(staging, final)
            fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("built image %s in %.1fs (%d MB)", recipe.key, info.build_seconds, info.size_bytes >> 20)
        return info

    def _run_build(self, argv: list[str], progress: ProgressCallback | None) -> None:
        tail: list[str] = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                tail = [*tail[-19:], line]
                log.debug("mmdebstrap: %s", line)
                if progress is not None and line:
                    progress(line)
        if proc.returncode != 0:
            raise BackendError(f"mmdebstrap failed with exit code {proc.returncode}; last output:\n" + "\n".join(tail))
