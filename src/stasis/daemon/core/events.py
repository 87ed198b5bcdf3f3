"""Lifecycle events: what a sandbox's transition means to someone outside it (a webhook). Each is written in the
transition's own transaction (:meth:`.store.Store._journal`), so the ``events`` table is a durable outbox: an
event exists exactly when its transition does, and a daemon killed before delivering it delivers it after."""

from __future__ import annotations

from ...models import SandboxStatus

S = SandboxStatus


def event_of(
    current: S | None, target: S, detail: str | None, intent: str | None, forked_from: str | None
) -> tuple[str, str | None] | None:
    """(type, reason) of a transition from ``current`` to ``target``, or None for a step nobody outside sees
    (an intent such as ``suspending``). ``intent``: the detail of the intent this outcome ends."""
    detail = detail or ""
    if target == S.RUNNING:
        if current == S.PENDING:
            return ("forked", f"fork of {forked_from}") if forked_from else ("created", None)
        if current == S.RESUMING:
            return "resumed", intent or None
        if current == S.SNAPSHOTTING:
            return "checkpointed", None
        if current == S.RUNNING:
            return ("created", detail) if detail.startswith("claimed from pool") else ("updated", detail or None)
        return None  # a suspend rolled back: it never stopped running
    if target == S.SUSPENDED:
        if current is None:
            return "moved", detail or "arrived"
        if current == S.SUSPENDING:
            return "suspended", "idle" if "idle" in (intent or "") else "request"
        if current == S.SUSPENDED:
            return "updated", detail or None
        return None
    if target == S.TERMINATED:
        return ("moved", detail) if detail.startswith("moved to") else ("killed", detail or None)
    if target == S.FAILED:
        return "failed", detail or None
    return None
