"""Request recipes for images, which only the daemon writes: import (a registry's image by reference, or a
local archive or OCI layout uploaded), a recipe's build, listing, removal. Pure: no I/O but reading the
local file an upload sends."""

from __future__ import annotations

import contextlib
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import ImageNotFound, InvalidRequest
from ..images import ImageInfo
from ..models import BuildImageRequest, CommitImageRequest
from ._base import Call, _model, _models

UPLOAD_CHUNK = 1 << 20
ProgressCallback = Callable[[str], None]


def images_call() -> Call:
    return Call("GET", "/v1/images", _models(ImageInfo))


def image_call(name: str) -> Call:
    return Call("GET", f"/v1/images/{name}", _model(ImageInfo))


def remove_image_call(name: str) -> Call:
    return Call("DELETE", f"/v1/images/{name}", lambda r: r.json())


def prune_images_call(everything: bool) -> Call:
    return Call("POST", "/v1/images/prune", lambda r: r.json(), params={"everything": "true"} if everything else None)


def commit_image_call(request: CommitImageRequest) -> Call:
    return Call("POST", "/v1/images/commit", _model(ImageInfo), json=request.model_dump())


def build_image_call(recipe: str, force: bool) -> Call:
    return Call("POST", "/v1/images/build", json=BuildImageRequest(recipe=recipe, force=force).model_dump())


@contextlib.contextmanager
def import_image_call(ref: str, name: str) -> Iterator[Call]:
    """A registry's image by reference; anything on this machine (docker-archive:PATH, oci-archive:PATH[:TAG],
    oci:DIR[:TAG]) uploaded as an archive, so a daemon on another machine gets the same image."""
    if ref.startswith("docker://"):
        yield Call("POST", "/v1/images/import", params={"name": name, "ref": ref})
        return
    kind, _, rest = ref.partition(":")
    if kind not in ("docker-archive", "oci-archive", "oci"):
        raise InvalidRequest(
            f"cannot import {ref[:120]!r}: name its transport, one of docker-archive:PATH (what `docker save` "
            "writes), oci-archive:PATH, oci:DIR[:TAG] or docker://REGISTRY/REPO:TAG"
        )
    path, tag = Path(rest), None
    if kind != "docker-archive" and not path.exists() and ":" in rest:
        head, tag = rest.rsplit(":", 1)
        path = Path(head)
    if not path.exists():
        raise InvalidRequest(f"cannot import {ref[:120]!r}: {path} does not exist")
    params: dict[str, Any] = {"name": name, "archive": "docker-archive" if kind == "docker-archive" else "oci-archive"}
    if tag:
        params["tag"] = tag
    with _archive_of(kind, path) as archive:
        yield Call("POST", "/v1/images/import", params=params, content=_chunks(archive))


@contextlib.contextmanager
def _archive_of(kind: str, path: Path) -> Iterator[Path]:
    """The file to upload: the archive itself, or an OCI layout directory packed as an oci-archive (which is
    exactly a tar of the layout)."""
    if kind != "oci":
        yield path
        return
    fd, packed = tempfile.mkstemp(prefix="stasis-oci-", suffix=".tar")
    os.close(fd)
    try:
        with tarfile.open(packed, "w") as tar:
            for entry in sorted(path.iterdir()):
                tar.add(entry, arcname=entry.name)
        yield Path(packed)
    finally:
        os.unlink(packed)


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(UPLOAD_CHUNK):
            yield chunk


def first_use_recipe(error: ImageNotFound) -> str | None:
    """The built-in recipe a call named that the daemon has not built yet (the SDK builds it on its first use and
    asks again), or None for any other missing image."""
    image = error.details.get("image")
    return image if error.details.get("buildable") is True and isinstance(image, str) else None


FIRST_USE = "image %r is not built on this host yet: building it now, on its first use (once; minutes for a large one)"


def image_result(events: Iterator[dict[str, Any]], on_progress: ProgressCallback | None) -> ImageInfo:
    """The image a streamed import or build ends with (its progress lines to ``on_progress``)."""
    for event in events:
        if "progress" in event and on_progress is not None:
            on_progress(event["progress"])
        if "result" in event:
            return ImageInfo.model_validate(event["result"])
    raise InvalidRequest("the daemon's answer ended before the image was ready; see the daemon's log")
