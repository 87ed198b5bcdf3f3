"""`stasis doctor`: what works on this host, probed for real, with the reason when it does not."""

from __future__ import annotations

from typing import Any

from .backends import BACKENDS, create_backend
from .errors import StasisError
from .images import ImageStore
from .paths import Paths

BUILD_STEP_PREFIX = "build-"  # an Image build's cached step (stasis.sdk.image), not an image of its own


async def check_host(paths: Paths) -> dict[str, Any]:
    backends: dict[str, dict[str, Any]] = {}
    for name in BACKENDS:
        try:
            backend = create_backend(name, paths)
            async with backend.serving():
                backends[name] = {"works": True, **backend.describe()}
        except StasisError as exc:
            backends[name] = {"works": False, "problem": exc.message}
    built = ImageStore(paths.images).list()
    images = [info.key for info in built if not info.name.startswith(BUILD_STEP_PREFIX)]
    return {"backends": backends, "images": images, "build_step_caches": len(built) - len(images)}
