"""The E2B face from the client's side: the images of E2B's ``base`` and ``code-interpreter-v1`` templates, the
latter's warm template, and a listener held open."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Unpack

from .. import guest, kernels
from ..e2b_models import E2bServeRequest
from ..e2b_wire import BASE_IMAGE, CODE_IMAGE, code_template_name
from ..errors import NotFound
from ..images import ImageInfo
from ..models import TEMPLATE_PREFIX
from ._base import Call, CreateOptions, checkpoint_call
from ._client import Client
from .image import Image, StepCallback

# E2B's conventions: a non-root `user` (home /home/user, passwordless sudo) runs commands and kernels by default
USER_SETUP = (
    "id -u user >/dev/null 2>&1 || useradd --create-home --shell /bin/bash user; "
    "mkdir -p /etc/sudoers.d && echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/user "
    "&& chmod 0440 /etc/sudoers.d/user"
)
# sudo where setuid cannot work (gVisor): stasis' shim asks the agent, which runs commands for the users named
SUDO_SETUP = "chmod 0755 /usr/local/bin/sudo && mkdir -p /etc/stasis && echo user > /etc/stasis/sudo-users"


def _e2b_user(image: Image) -> Image:
    """E2B's ``user``, and its sudo; COPY finds the shim beside the agent's files."""
    shipped = dataclasses.replace(image, context=Path(guest.__file__).resolve().parent)
    return shipped.run(USER_SETUP).copy("sudo_shim.py", "/usr/local/bin/sudo").run(SUDO_SETUP)


BASE = _e2b_user(Image.from_image("default")).user("user").workdir("/home/user")
# the user's site-packages made now, so a kernel started before a `pip install` has it on its path already
USER_SITE = "runuser -u user -- sh -c 'mkdir -p \"$(python3 -m site --user-site)\"'"
CODE = _e2b_user(Image.from_image(kernels.IMAGE)).run(USER_SITE).user("user").workdir("/home/user")


def base_image(client: Client | None = None, on_step: StepCallback | None = None) -> ImageInfo:
    """The image E2B's ``base`` template runs on: built once (each step cached), found after."""
    return _image(BASE_IMAGE, BASE, client or Client(), on_step)


def code_image(client: Client | None = None, on_step: StepCallback | None = None) -> ImageInfo:
    """The image E2B's ``code-interpreter-v1`` runs on: stasis' code-interpreter image as E2B's user."""
    return _image(CODE_IMAGE, CODE, client or Client(), on_step)


def code_template(backend: str, client: Client | None = None, **options: Unpack[CreateOptions]) -> None:
    """E2B's ``code-interpreter-v1`` warm on ``backend``: its kernel server and a Python kernel already running
    in every sandbox made from it (made once per backend, found after). ``options``: the sandbox it is made in."""
    from .template import interpreter_template

    client = client or Client()
    image = code_image(client)
    name = code_template_name(backend)
    with contextlib.suppress(NotFound):
        made = client.call(checkpoint_call("GET", TEMPLATE_PREFIX + name))
        if (made.backend, made.image) == (backend, image.key):  # this backend, this very image (not an older one)
            return
    interpreter_template(name, image=CODE_IMAGE, backend=backend, replace=True, client=client, **options)


def _image(name: str, recipe: Image, client: Client, on_step: StepCallback | None) -> ImageInfo:
    """Built from its recipe each time: every step found in the cache when nothing changed (a few calls, no
    sandbox), the changed ones built again when stasis' recipe or the image below it changed."""
    return recipe.build(name, client=client, on_step=on_step)


def serve(request: E2bServeRequest, client: Client | None = None) -> Iterator[dict[str, Any]]:
    """Open the listener; yields its first line (``listening``, ``exports``), then heartbeats. Closing the
    iterator (or the process ending) closes the listener."""
    call = Call("POST", "/v1/e2b/serve", lambda response: None, json=request.model_dump(mode="json"))
    yield from (client or Client()).stream_lines(call)
