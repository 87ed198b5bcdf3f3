"""The on-disk image of a suspend, the same for every backend: written, then sealed by one rename.

    <sandbox>/suspend.partial/   while being written (never trusted as is)
    <sandbox>/suspend/           sealed: complete, fsynced, what a resume loads

A backend names the file whose presence makes an image loadable (its ``marker``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..fsutil import fsync_dir, fsync_file, fsync_tree
from .base import HostState


class SuspendImage:
    def __init__(self, directory: Path, marker: str) -> None:
        self.directory = directory
        self.partial = directory / "suspend.partial"
        self.final = directory / "suspend"
        self.marker = marker

    @property
    def sealed(self) -> bool:
        return (self.final / self.marker).exists()

    @property
    def unsealed(self) -> bool:
        """Written (its marker exists) but cut off before the seal."""
        return (self.partial / self.marker).exists() and not self.sealed

    def host_state(self) -> HostState:
        """What this image says about a sandbox whose processes are gone."""
        if self.sealed:
            return HostState.SUSPENDED
        return HostState.PARTIAL if self.unsealed else HostState.STOPPED

    def begin(self) -> Path:
        shutil.rmtree(self.partial, ignore_errors=True)
        self.partial.mkdir()
        return self.partial

    def seal(self, *also_fsync: Path) -> None:
        """fsync the image (and files it refers to, e.g. a VM's RAM and disk), then rename it into place."""
        for path in also_fsync:
            fsync_file(path)
        fsync_tree(self.partial)
        shutil.rmtree(self.final, ignore_errors=True)
        os.rename(self.partial, self.final)
        fsync_dir(self.directory)

    def seal_unsealed(self) -> bool:
        """Adopt an image a cut-off suspend wrote but never sealed; True if there was one to try."""
        if not self.unsealed:
            return False
        shutil.rmtree(self.final, ignore_errors=True)
        os.rename(self.partial, self.final)
        return True

    def discard_partial(self) -> None:
        shutil.rmtree(self.partial, ignore_errors=True)

    def discard(self) -> None:
        """Forget both: the sandbox runs on from here, an old image must never be loaded again."""
        shutil.rmtree(self.partial, ignore_errors=True)
        shutil.rmtree(self.final, ignore_errors=True)
