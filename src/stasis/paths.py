"""Where stasis keeps its state. Everything lives under ``STASIS_HOME``.

$STASIS_HOME/
  stasis.sock  daemon.pid  daemon.lock  daemon.log  stasis.db
  images/<name>-<hash>/rootfs, image.json     (or $STASIS_IMAGE_DIR)
  sandboxes/<id>/...                            owned by the sandbox's backend
  run/runsc/                                    runsc's state directory
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path


def default_home() -> Path:
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "stasis"


@dataclass(frozen=True)
class Paths:
    home: Path
    images: Path

    @classmethod
    def from_env(cls) -> Paths:
        home = Path(os.environ.get("STASIS_HOME") or default_home()).absolute()
        images = Path(os.environ.get("STASIS_IMAGE_DIR") or home / "images").absolute()
        return cls(home=home, images=images)

    @property
    def socket(self) -> Path:
        return self.home / "stasis.sock"

    @property
    def pidfile(self) -> Path:
        return self.home / "daemon.pid"

    @property
    def lockfile(self) -> Path:
        return self.home / "daemon.lock"

    @property
    def logfile(self) -> Path:
        return self.home / "daemon.log"

    @property
    def database(self) -> Path:
        return self.home / "stasis.db"

    @property
    def agent_journal(self) -> Path:
        return self.home / "agent.db"

    @property
    def sandboxes(self) -> Path:
        return self.home / "sandboxes"

    @property
    def volumes(self) -> Path:
        return self.home / "volumes"

    @property
    def volume_image(self) -> Path:
        """The btrfs file system the volumes live in, where the host allows (:mod:`stasis.volume_btrfs`)."""
        return self.home / "volumes.btrfs"

    @property
    def runtime(self) -> Path:
        """Per-boot state (runsc's container records): on tmpfs, so a host reboot clears it.

        Kept short on purpose: runsc puts unix sockets below it, and those paths are
        limited to 108 bytes, which a deep STASIS_HOME would exceed.
        """
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        base = Path("/run") if os.access("/run", os.W_OK) else Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
        return base / "stasis" / digest

    @property
    def mount_pin(self) -> Path:
        """Where the daemon's mount namespace is pinned (:mod:`stasis.mountns`): beside the runtimes of all homes,
        in one directory that is a private mount."""
        return self.runtime.parent / "mnt" / self.runtime.name

    @property
    def runsc_root(self) -> Path:
        return self.runtime / "runsc"

    def ensure(self) -> None:
        for directory in (self.home, self.sandboxes, self.images, self.runsc_root):
            directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
        os.chmod(self.runtime, 0o700)
