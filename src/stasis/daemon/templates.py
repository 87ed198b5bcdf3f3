"""Templates that start warm: an image booted once, its start command running and ready, kept as a
MEMORY checkpoint named ``template-NAME``. A sandbox created from it restores that checkpoint, so
its server (a dev server, a Jupyter kernel) already runs. Made by :class:`stasis.Template`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import CheckpointNotFound, NotFound
from ..models import TEMPLATE_PREFIX as PREFIX

if TYPE_CHECKING:
    from .service import SandboxService


def template_checkpoint(service: SandboxService, template: str) -> str:
    try:
        return service.store.get_checkpoint(PREFIX + template).id
    except CheckpointNotFound:
        names = [
            c.name.removeprefix(PREFIX) for c in service.store.list_checkpoints() if (c.name or "").startswith(PREFIX)
        ]
        raise NotFound(
            f"no template named {template!r}"
            + (f"; templates: {', '.join(sorted(names))}" if names else "")
            + "; make one with `stasis template create`"
        ) from None
