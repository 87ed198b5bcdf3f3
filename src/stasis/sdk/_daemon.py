"""Starting the daemon on demand, the way the CLI and SDK do when none answers."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from ..paths import Paths

log = logging.getLogger(__name__)


def start_daemon(paths: Paths) -> None:
    """Start `stasis serve` in its own session, logging to ``daemon.log``; do not wait for it."""
    paths.home.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.home, 0o700)
    log.info("starting the stasis daemon for %s", paths.home)
    with open(paths.logfile, "ab") as logfile:
        subprocess.Popen(
            [sys.executable, "-m", "stasis", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=logfile,
            start_new_session=True,  # a Ctrl-C in the caller's terminal must not stop it
            env={**os.environ, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)},
        )
