"""Reused threads for the agent's jobs: a request, the pump of a pipe.

Starting a thread costs ~1.2 ms in a gVisor sandbox on these hosts (benchmarks/exec.py), and an
exec starts three (its request, the pumps of its stdout and stderr). A finished job's thread
waits a while for the next one; a job that finds no idle thread starts a new one, so jobs never
queue behind each other (some run for hours: a background process's pump).

Runs inside the sandbox (standard library only).
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only names for the annotations: the image's python3 may predate subscripted builtins
    Job = tuple[Any, tuple[Any, ...]]
    Inbox = queue.SimpleQueue[Job]

IDLE_KEPT = 16  # idle threads kept waiting; one more exits instead
IDLE_SECS = 60.0  # an idle thread exits after this long without a job


class Workers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[Inbox] = []  # inboxes of idle threads; the warmest last

    def submit(self, target: Any, *args: Any) -> None:
        """Run ``target(*args)`` on a thread of its own. RuntimeError if none can be started."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is not None:
            inbox.put((target, args))
            return
        inbox: Inbox = queue.SimpleQueue()
        threading.Thread(target=self._work, args=(inbox, (target, args)), daemon=True).start()

    def _work(self, inbox: Inbox, job: Job | None) -> None:
        while job is not None:
            target, args = job
            try:
                target(*args)
            except Exception:  # as a thread of its own would: reported, and the next job still runs
                import traceback

                traceback.print_exc()
            job = self._park(inbox)

    def _park(self, inbox: Inbox) -> Job | None:
        """The next job, or None when this thread should end."""
        with self._lock:
            if len(self._idle) >= IDLE_KEPT:
                return None
            self._idle.append(inbox)
        try:
            return inbox.get(timeout=IDLE_SECS)
        except queue.Empty:
            with self._lock:
                if inbox in self._idle:
                    self._idle.remove(inbox)
                    return None
            return inbox.get()  # taken off the idle list a moment ago: its job is on the way

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


WORKERS = Workers()
