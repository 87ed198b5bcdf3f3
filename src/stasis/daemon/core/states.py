"""The sandbox state machine, as data.

    pending ──► running ◄──────────────► suspending ──► suspended ──► resuming ──► running
       │          │   ▲ (rollback)            │            ▲ (rollback)  │
       └──────────┴───┴──► terminating ──► terminated      └─────────────┘
    running ──► snapshotting ──► running        (a checkpoint: paused briefly, then on)
    any live state ──► failed ──► terminating, or ──► resuming (a cold boot with its files)
    any state but terminated ──► terminating: removing a sandbox always works, even one stuck mid-way

States ending in -ing are *intents*: they are written before the work starts,
and replaced by an *outcome* when it ends. A daemon that finds an intent on
start-up knows the work was cut off and finishes or rolls it back.
"""

from __future__ import annotations

from ...errors import StateError
from ...models import SandboxInfo
from ...models import SandboxStatus as S

TRANSITIONS: dict[S, frozenset[S]] = {
    S.PENDING: frozenset({S.RUNNING, S.TERMINATING, S.FAILED}),
    S.RUNNING: frozenset({S.SUSPENDING, S.SNAPSHOTTING, S.TERMINATING, S.FAILED}),
    S.SNAPSHOTTING: frozenset({S.RUNNING, S.FAILED, S.TERMINATING}),
    S.SUSPENDING: frozenset({S.SUSPENDED, S.RUNNING, S.FAILED, S.TERMINATING}),
    S.SUSPENDED: frozenset({S.RESUMING, S.TERMINATING, S.FAILED}),
    S.RESUMING: frozenset({S.RUNNING, S.SUSPENDED, S.FAILED, S.TERMINATING}),
    S.TERMINATING: frozenset({S.TERMINATED}),
    S.FAILED: frozenset({S.TERMINATING, S.RESUMING}),  # resuming a failed sandbox boots it with its files
    S.TERMINATED: frozenset(),
}

COLD_SUSPEND = "suspended_without_memory"  # its runtime's flag: suspended with its files only; a resume boots it

INTENTS = frozenset({S.PENDING, S.SUSPENDING, S.RESUMING, S.SNAPSHOTTING, S.TERMINATING})

# What a user asked for, per state it cannot be done in: the message says what to do instead.
WHY_NOT: dict[S, str] = {
    S.PENDING: "is still being created; try again in a moment",
    S.SUSPENDING: "is being suspended; try again in a moment",
    S.SNAPSHOTTING: "is being checkpointed; try again in a moment",
    S.SUSPENDED: "is suspended; resume it first (`stasis resume {name}`)",
    S.RESUMING: "is being resumed; try again in a moment",
    S.TERMINATING: "is being removed",
    S.TERMINATED: "was removed",
    S.FAILED: (
        "has failed ({error}); `stasis resume {name}` boots it again with its files, `stasis rm {name}` removes it"
    ),
    S.RUNNING: "is running",
}


def check_transition(sandbox_id: str, current: S, target: S) -> None:
    if target not in TRANSITIONS[current]:
        allowed = sorted(s.value for s in S if target in TRANSITIONS[s])
        raise StateError(
            f"sandbox {sandbox_id}: illegal transition {current.value} → {target.value}",
            status=current.value,
            required=allowed,
        )


def require(info: SandboxInfo, wanted: S) -> None:
    """Raise a StateError that says what to do, unless the sandbox is in state ``wanted``."""
    if info.status != wanted:
        why = WHY_NOT[info.status].format(name=info.name or info.id, error=info.error)
        if info.moved_to:  # it left this node through the remote store: that is where it is now
            why = f"moved to {info.moved_to}; `stasis resume {info.name or info.id}` takes it back from there"
        raise StateError(f"sandbox {info.name or info.id!r} {why}", status=info.status.value, required=[wanted.value])


def phase(target: S) -> str:
    return "intent" if target in INTENTS else "outcome"
