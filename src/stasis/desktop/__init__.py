"""A desktop in a sandbox: an X server, a window manager, Chromium and a VNC server, for computer-use agents.

``session.py`` runs inside the sandbox (standard library only) and starts the session; the daemon starts it
with :func:`bootstrap` (its source travels in the command, so the image needs none of stasis). Everything it
starts is a process of the sandbox: suspended, checkpointed, forked and moved with it, tabs and logins included.
"""

from __future__ import annotations

import base64
import re
import zlib
from pathlib import Path

IMAGE = "desktop"  # the recipe with the session's programs (stasis.images.recipe)
SESSION_NAME = "stasis-desktop"  # the background process's name in the sandbox
DISPLAY = ":0"
VNC_PORT = 5900  # x11vnc, on the sandbox's loopback only: reached through the daemon, behind its tokens
DEFAULT_SCREEN = "1280x800"
SCREEN = re.compile(r"^([1-9][0-9]{2,3})x([1-9][0-9]{2,3})$")


def bootstrap(screen: str = DEFAULT_SCREEN) -> list[str]:
    """argv that starts the session in a sandbox."""
    source = (Path(__file__).parent / "session.py").read_bytes()
    packed = base64.b64encode(zlib.compress(source, 9)).decode()
    program = f"import base64,zlib;exec(compile(zlib.decompress(base64.b64decode('{packed}')),'stasis-desktop','exec'))"
    return ["python3", "-c", program, screen]


__all__ = ["DEFAULT_SCREEN", "DISPLAY", "IMAGE", "SCREEN", "SESSION_NAME", "VNC_PORT", "bootstrap"]
