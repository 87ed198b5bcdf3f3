"""Isolation backends. Each implements :class:`~stasis.backends.base.Backend`."""

from __future__ import annotations

from ..paths import Paths
from .base import Backend, BoxRef, HostState

BACKENDS = ("gvisor", "microvm")


def create_backend(name: str, paths: Paths) -> Backend:
    if name == "gvisor":
        from .gvisor import GvisorBackend  # lazy: a backend's dependencies load only when chosen

        return GvisorBackend(paths)
    if name == "microvm":
        from .microvm import MicrovmBackend

        return MicrovmBackend(paths)
    raise ValueError(f"unknown backend {name!r}")


__all__ = ["BACKENDS", "Backend", "BoxRef", "HostState", "create_backend"]
