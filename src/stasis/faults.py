"""Fault injection for crash-safety tests.

``STASIS_KILL_POINT=<name>`` makes the process SIGKILL itself when it reaches
:func:`point` with that name; every point reached is logged at debug level so a
test can list them. Costs one dict lookup when unset.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

_KILL_POINT = os.environ.get("STASIS_KILL_POINT")


def point(name: str) -> None:
    if _KILL_POINT is not None and name == _KILL_POINT:
        log.warning("kill point %s reached: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
