"""The E2B face from the client's side: the ``base`` template's image, and a listener held open."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import ImageNotFound
from ..images import ImageInfo
from ..models import E2bServeRequest
from ._base import Call
from ._client import Client
from .image import Image, StepCallback, get_image

BASE_IMAGE = "e2b-base"
# E2B's conventions on stasis' default image: a non-root `user` (home /home/user) runs commands by default.
BASE = (
    Image.from_image("default")
    .run("id -u user >/dev/null 2>&1 || useradd --create-home --shell /bin/bash user")
    .user("user")
    .workdir("/home/user")
)


def base_image(client: Client | None = None, on_step: StepCallback | None = None) -> ImageInfo:
    """The image E2B's ``base`` template runs on: built once (each step cached), found after."""
    client = client or Client()
    try:
        return get_image(BASE_IMAGE, client=client)
    except ImageNotFound:
        return BASE.build(BASE_IMAGE, client=client, on_step=on_step)


def serve(request: E2bServeRequest, client: Client | None = None) -> Iterator[dict[str, Any]]:
    """Open the listener; yields its first line (``listening``, ``exports``), then heartbeats. Closing the
    iterator (or the process ending) closes the listener."""
    call = Call("POST", "/v1/e2b/serve", lambda response: None, json=request.model_dump(mode="json"))
    yield from (client or Client()).stream_lines(call)
