"""What the synchronous benchmarks share: a daemon of their own on a temporary STASIS_HOME."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from stasis.paths import Paths, default_home


@contextmanager
def serving_daemon(prefix: str, **extra_env: str) -> Iterator[Paths]:
    """Start `stasis serve` on a fresh home (images shared with the user's cache); stop and clean up after."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    images = Path(os.environ.get("STASIS_IMAGE_DIR") or default_home() / "images")
    paths = Paths(home=root / "home", images=images)
    paths.ensure()
    env = {**os.environ, **extra_env, "STASIS_HOME": str(paths.home), "STASIS_IMAGE_DIR": str(paths.images)}
    daemon = subprocess.Popen([sys.executable, "-m", "stasis", "serve"], env=env, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(paths.socket))) as http:
            for _ in range(600):
                try:
                    http.get("http://stasis/v1/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.05)
        yield paths
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        shutil.rmtree(paths.runtime, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
