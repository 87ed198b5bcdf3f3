"""Isolation backends: one registry of names, each implementing :class:`~stasis.backends.base.Backend`.

This module imports nothing heavy: the spec model derives its allowed backends from
``BACKENDS``, and a backend's code loads only when it is created.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..paths import Paths
    from .base import Backend

# name -> "module:Class", imported on first use
BACKENDS: dict[str, str] = {
    "gvisor": "stasis.backends.gvisor:GvisorBackend",
    "microvm": "stasis.backends.microvm:MicrovmBackend",
}
DEFAULT_BACKEND = "gvisor"


def register_backend(name: str, target: str) -> None:
    """Add a backend (e.g. a test's fake) under ``name``; ``target`` is "module:Class"."""
    BACKENDS[name] = target


def backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def create_backend(name: str, paths: Paths) -> Backend:
    return backend_class(name)(paths)  # type: ignore[call-arg]
