"""QEMU microvm backend (see backend.py)."""

from .backend import MicrovmBackend

__all__ = ["MicrovmBackend"]
