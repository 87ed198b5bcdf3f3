"""When each sandbox was last used, and whether it is in use now; kept in memory.

A write per exec would cost an fsync, so the last-use times reach the store only
from time to time (and on shutdown); a restarted daemon gives every sandbox a full
idle window anyway.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from ...models import SandboxInfo, SandboxStatus
from .store import Store


def idle_action(info: SandboxInfo) -> str:
    """Named sandboxes are kept (suspended); unnamed ones are disposable (terminated)."""
    return info.spec.on_idle or ("suspend" if info.name else "terminate")


Clock = Callable[[], float]  # wall-clock seconds: time.time, or a test's own


class Activity:
    def __init__(self, clock: Clock = time.time) -> None:
        self.clock = clock
        self._last: dict[str, float] = {}
        self._inflight: dict[str, int] = {}  # operations under way: a sandbox in use is never idle

    def touch(self, sandbox_id: str) -> None:
        self._last[sandbox_id] = self.clock()

    def last(self, info: SandboxInfo) -> float:
        return self._last.get(info.id) or info.last_activity

    @contextlib.contextmanager
    def busy(self, sandbox_id: str) -> Iterator[None]:
        """The sandbox counts as in use (never idle) while the block runs."""
        self._inflight[sandbox_id] = self._inflight.get(sandbox_id, 0) + 1
        self.touch(sandbox_id)
        try:
            yield
        finally:
            if sandbox_id in self._inflight:  # else it was forgotten meanwhile: the sandbox is gone
                self._inflight[sandbox_id] -= 1
                self.touch(sandbox_id)

    def in_use(self, sandbox_id: str) -> bool:
        """Whether an operation, a session or a view holds it (see :meth:`busy`)."""
        return self._inflight.get(sandbox_id, 0) > 0

    def is_idle(self, info: SandboxInfo) -> bool:
        if info.spec.timeout_secs is None or self.in_use(info.id):
            return False
        return self.clock() - self.last(info) >= info.spec.timeout_secs

    def due(self, info: SandboxInfo) -> bool:
        """Whether its idle action is due: idle for its timeout, or past its deadline (used or not: a lifetime
        ends, as E2B's timeout does, even mid-command)."""
        return (info.deadline is not None and self.clock() >= info.deadline) or self.is_idle(info)

    def present(self, info: SandboxInfo, describe: Callable[[dict[str, Any]], dict[str, Any]] | None) -> SandboxInfo:
        """``info`` with its last use and idle deadline (none while in use: a session or a view holds it), and
        its backend's view of its state (``describe``)."""
        last = self.last(info)
        update: dict[str, Any] = {"last_activity": last}
        if info.status == SandboxStatus.RUNNING and (info.spec.timeout_secs is not None or info.deadline is not None):
            idle_at = None if info.spec.timeout_secs is None or self.in_use(info.id) else last + info.spec.timeout_secs
            ends = [at for at in (idle_at, info.deadline) if at is not None]
            update["idle_action"] = idle_action(info)
            update["idle_action_at"] = min(ends) if ends else None
        if describe is not None:
            with contextlib.suppress(ValueError):
                update["runtime"] = describe(info.runtime)
        return info.model_copy(update=update)

    def forget(self, sandbox_id: str) -> None:
        self._last.pop(sandbox_id, None)
        self._inflight.pop(sandbox_id, None)

    def persist(self, store: Store) -> None:
        for sandbox_id, last in self._last.items():
            store.touch_at(sandbox_id, last)
