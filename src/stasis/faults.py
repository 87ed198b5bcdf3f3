"""Fault injection for crash-safety tests.

``STASIS_KILL_POINT=<name>`` makes the process SIGKILL itself when it reaches
:func:`point` with that name; ``STASIS_FAIL_POINT=<name>`` makes it raise a
``BackendError`` there instead. Costs two dict lookups when unset. Every name
passed to :func:`point` is listed in ``POINTS`` or in its backend's ``kill_points``
(a test keeps the lists honest).
"""

from __future__ import annotations

import logging
import os
import signal

from .errors import BackendError

log = logging.getLogger(__name__)

_KILL_POINT = os.environ.get("STASIS_KILL_POINT")
_FAIL_POINT = os.environ.get("STASIS_FAIL_POINT")

POINTS = (
    "create.after_intent",
    "create.before_outcome",
    "suspend.after_intent",
    "suspend.before_outcome",
    "resume.after_intent",
    "resume.before_outcome",
    "checkpoint.after_intent",
    "checkpoint.before_seal",
    "checkpoint.after_seal",
    "checkpoint.before_outcome",
    "fork.after_checkpoint",
    "fork.after_children",
    "terminate.after_intent",
    "terminate.after_close",
    "terminate.before_outcome",
    "network.attach.after_namespaces",
    "network.attach.after_firewall",
    "network.detach.after_close",
    "image.commit.before_rename",
    "remote.push.after_chunks",
    "remote.push.after_manifest",
    "remote.pull.after_take",
)  # the daemon's own; each backend lists its windows in its ``kill_points``


def all_points() -> tuple[str, ...]:
    """The daemon's points and those of every registered backend."""
    from .backends import BACKENDS, backend_class

    return POINTS + tuple(p for name in BACKENDS for p in backend_class(name).kill_points)


# The agent harness's own points (the harness is a client process, not the daemon).
AGENT_POINTS = (
    "agent.after_model_response",
    "agent.after_tool_intent",
    "agent.after_tool_result",
)


def point(name: str) -> None:
    if _KILL_POINT is not None and name == _KILL_POINT:
        log.warning("kill point %s reached: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
    if _FAIL_POINT is not None and name == _FAIL_POINT:
        log.warning("fail point %s reached", name)
        raise BackendError(f"injected failure at {name}")
