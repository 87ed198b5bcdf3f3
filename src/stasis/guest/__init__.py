"""The guest side: the agent that runs inside every sandbox, and the host's typed client for it.

Only the files in ``AGENT_FILES`` go into a sandbox (standard library only); ``channel.py``
and ``client.py`` are the host's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

AGENT_DIR = Path(__file__).resolve().parent
AGENT_FILES = (
    "boot.py", "agent.py", "protocol.py", "wire.py", "processes.py", "commands.py", "terminals.py", "files.py",
    "fence.py", "workers.py", "watches.py", "sockets.py", "changes.py",
    "untar.py", "protocol_files.py", "sudo.py", "hostclock.py",
)  # fmt: skip


def agent_digest() -> str:
    """Changes whenever any file shipped into sandboxes changes."""
    digest = hashlib.sha256()
    for name in AGENT_FILES:
        digest.update(name.encode() + b"\0" + (AGENT_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]
