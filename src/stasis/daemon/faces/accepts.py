"""Accepting connections when the daemon is out of file descriptors (EMFILE) or memory.

asyncio's listeners already pause for a second when ``accept()`` fails that way (no busy loop), but report each
failure through the loop's exception handler, which logs a traceback: every listener, every second, for as long
as the shortage lasts. Here such a failure is one warning line, said again at most once per ``QUIET_SECS``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger(__name__)

ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message for it (selector_events.py)
QUIET_SECS = 60.0


def quiet_accept_failures(loop: asyncio.AbstractEventLoop) -> None:
    """Install on ``loop``: accept failures for want of resources become a line a minute; the rest go on as before."""
    previous = loop.get_exception_handler()
    said_at: dict[int | None, float] = {}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if context.get("message") != ACCEPT_FAILED or not isinstance(error, OSError):
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - said_at.get(error.errno, -QUIET_SECS) >= QUIET_SECS:
            said_at[error.errno] = now
            log.warning("cannot accept connections: %s; listeners retry every second (said once a minute): "
                        "raise the daemon's file limit (ulimit -n) or find what holds descriptors",
                        error.strerror or error)  # fmt: skip

    loop.set_exception_handler(handler)
