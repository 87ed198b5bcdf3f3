"""gVisor (runsc) backend."""

from .backend import GvisorBackend

__all__ = ["GvisorBackend"]
