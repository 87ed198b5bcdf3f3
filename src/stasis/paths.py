"""Where stasis keeps its state. Everything lives under ``STASIS_HOME``.

$STASIS_HOME/
  stasis.sock  daemon.pid  daemon.lock  daemon.log  stasis.db
  images/<name>-<hash>/rootfs, image.json     (or $STASIS_IMAGE_DIR)
  sandboxes/<id>/...                            owned by the sandbox's backend
  run/runsc/                                    runsc's state directory
"""

from __future__ import annotations

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
    def sandboxes(self) -> Path:
        return self.home / "sandboxes"

    @property
    def runsc_root(self) -> Path:
        return self.home / "run" / "runsc"

    def ensure(self) -> None:
        for directory in (self.home, self.sandboxes, self.images, self.runsc_root):
            directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.home, 0o700)
