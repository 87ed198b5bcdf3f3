"""A desktop in a sandbox: an X server, a window manager, Chromium and a VNC server, for computer-use agents.

``session.py`` runs inside the sandbox (standard library only) and starts the session; the daemon starts it
with :func:`bootstrap` (its source travels in the command, so the image needs none of stasis). Everything it
starts is a process of the sandbox: suspended, checkpointed, forked and moved with it, tabs and logins included.
"""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

IMAGE = "desktop"  # the recipe with the session's programs (stasis.images.recipe)
SESSION_NAME = "stasis-desktop"  # the background process's name in the sandbox
DISPLAY = ":0"
# x11vnc, twice: one server takes input, the other (-viewonly) only shows the screen. Neither is published: the
# daemon reaches them from the host (the console's live view, behind its login) and nothing else can.
VNC_PORT = 5900
VNC_VIEW_PORT = 5901
DEFAULT_SCREEN = "1280x800"
# built into the image by its recipe: a close_range runsc takes (stasis.images.recipe says why), to preload
GLIB_SPAWN_SHIM = "/usr/local/lib/stasis-close-range.so"


def bootstrap(screen: str = DEFAULT_SCREEN) -> list[str]:
    """argv that starts the session in a sandbox."""
    source = (Path(__file__).parent / "session.py").read_bytes()
    packed = base64.b64encode(zlib.compress(source, 9)).decode()
    program = f"import base64,zlib;exec(compile(zlib.decompress(base64.b64decode('{packed}')),'stasis-desktop','exec'))"
    return ["python3", "-c", program, screen]


__all__ = [
    "DEFAULT_SCREEN",
    "DISPLAY",
    "GLIB_SPAWN_SHIM",
    "IMAGE",
    "SESSION_NAME",
    "VNC_PORT",
    "VNC_VIEW_PORT",
    "bootstrap",
]
