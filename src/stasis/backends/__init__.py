"""Isolation backends. Each implements :class:`~stasis.backends.base.Backend`."""

from __future__ import annotations

from pathlib import Path

from .base import Backend, BoxRef, HostState


def create_backend(name: str, home: Path) -> Backend:
    if name == "gvisor":
        from .gvisor import GvisorBackend  # lazy: a backend's dependencies load only when chosen

        return GvisorBackend(home)
    raise ValueError(f"unknown backend {name!r}")


__all__ = ["Backend", "BoxRef", "HostState", "create_backend"]
