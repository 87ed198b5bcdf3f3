"""The one shape of a lifecycle operation, and its one rollback rule.

Every operation that changes a sandbox's state (create, suspend, resume, a checkpoint: the core's own and
the rooms' alike) runs as :meth:`SandboxService.operation`: under the sandbox's lock, it writes the intent,
passes its fault point, runs the body, and writes the outcome; a body that raises is rolled back by
:func:`rollback_target`'s rule. A daemon killed anywhere in between leaves the intent, which
:mod:`.recovery` finishes or rolls back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...backends.base import Backend, BoxRef, HostState
from ...guest.client import GuestChannel
from ...models import SandboxInfo, SandboxStatus

S = SandboxStatus

# Each intent's fault points (literal names: tests/daemon/test_crash_recovery.py kills the daemon at each)
POINTS: dict[SandboxStatus, tuple[str, str]] = {
    S.PENDING: ("create.after_intent", "create.before_outcome"),
    S.SUSPENDING: ("suspend.after_intent", "suspend.before_outcome"),
    S.RESUMING: ("resume.after_intent", "resume.before_outcome"),
    S.SNAPSHOTTING: ("checkpoint.after_intent", "checkpoint.before_outcome"),
}
OUTCOMES = {S.PENDING: S.RUNNING, S.SUSPENDING: S.SUSPENDED, S.RESUMING: S.RUNNING, S.SNAPSHOTTING: S.RUNNING}
VERBS = {S.PENDING: "start", S.SUSPENDING: "suspend", S.RESUMING: "resume", S.SNAPSHOTTING: "checkpoint"}
SPANS = {S.PENDING: "sandbox.create", S.SUSPENDING: "sandbox.suspend", S.RESUMING: "sandbox.resume",
         S.SNAPSHOTTING: "sandbox.checkpoint"}  # fmt: skip


@dataclass
class Step:
    """What the body of an operation is handed, and what it hands back for the outcome."""

    info: SandboxInfo  # the record as the operation found it; after the block, as the outcome wrote it
    intent: SandboxStatus
    backend: Backend
    box: BoxRef
    before: SandboxStatus | None  # where a rollback goes back to (None: a create, which is undone)
    detail: str | None = None  # the outcome's line in the journal
    fields: dict[str, Any] = field(default_factory=dict)  # columns the outcome sets (timings, backend state)
    channel: GuestChannel | None = None  # the guest's new channel, if the body started or resumed it


def rollback_target(before: SandboxStatus, host: HostState, reconnected: bool) -> SandboxStatus:
    """The one rule: back to where it was if the host still holds that (a running sandbox answering on a
    channel, a suspended one's image whole), failed otherwise. A create is undone instead (never here)."""
    if before == S.RUNNING:
        return S.RUNNING if reconnected else S.FAILED
    if before == S.SUSPENDED and host == HostState.SUSPENDED:
        return S.SUSPENDED
    return S.FAILED
