"""Fault injection for crash-safety tests.

``STASIS_KILL_POINT=<name>`` makes the process SIGKILL itself when it reaches
:func:`point` with that name; ``STASIS_FAIL_POINT=<name>`` makes it raise a
``BackendError`` there instead. Costs two dict lookups when unset. Every name
passed to :func:`point` is listed in ``POINTS`` or, for a backend's own windows, in
``BACKEND_POINTS`` (a test keeps the lists honest).
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
)  # the daemon's own

BACKEND_POINTS = {
    "gvisor": (
        "gvisor.start.after_mount", "gvisor.start.after_launch", "gvisor.start_from.after_copy",
        "gvisor.start_from.after_restore", "gvisor.suspend.after_sync", "gvisor.suspend.before_checkpoint",
        "gvisor.suspend.after_checkpoint", "gvisor.suspend.after_rename", "gvisor.suspend.after_delete",
        "gvisor.resume.before_mount", "gvisor.resume.before_restore", "gvisor.resume.after_restore",
        "gvisor.checkpoint.paused", "gvisor.checkpoint.after_files", "gvisor.checkpoint.after_memory",
        "gvisor.destroy.after_stop",
    ),
    "microvm": (
        "microvm.start.after_restore", "microvm.suspend.after_save", "microvm.suspend.after_quit",
        "microvm.suspend.after_rename", "microvm.resume.after_load", "microvm.checkpoint.after_save",
    ),
}  # fmt: skip


def all_points() -> tuple[str, ...]:
    """The daemon's points and those of every backend."""
    return POINTS + tuple(p for points in BACKEND_POINTS.values() for p in points)


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
