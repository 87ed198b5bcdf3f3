"""The guest agent's files on the host, one immutable directory per agent build.

A gVisor sandbox sees its agent's directory as a read-only bind mount at ``/opt/stasis``:
nothing is ever written through the sandbox's own tree (which sandbox code controls, and
where a planted link could send a write anywhere on the host). A sandbox keeps using the
directory it was started with, so a restore finds exactly the files it was saved with.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ...fsutil import fsync_dir, fsync_tree
from ...guest import AGENT_DIR, AGENT_FILES, agent_digest

MOUNT_POINT = "/opt/stasis"


def agent_dir(root: Path, digest: str | None = None) -> Path:
    """The directory of agent build ``digest`` (default: this build's), made on first use."""
    current = agent_digest()
    digest = digest or current
    final = root / digest
    if final.is_dir():
        return final
    if digest != current:
        raise FileNotFoundError(f"agent build {digest} is gone from {root}")
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=root))
    try:
        for name in AGENT_FILES:
            shutil.copyfile(AGENT_DIR / name, staging / name)
            os.chmod(staging / name, 0o444)
        os.chmod(staging, 0o555)
        fsync_tree(staging)
        try:
            os.rename(staging, final)
        except OSError:  # another daemon made it first: same bytes
            if not final.is_dir():
                raise
        fsync_dir(root)
    finally:
        if staging.exists():
            os.chmod(staging, 0o755)
            shutil.rmtree(staging, ignore_errors=True)
    return final
