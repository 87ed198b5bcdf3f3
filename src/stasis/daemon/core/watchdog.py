"""Noticing at once when a running sandbox dies on the host (the OOM killer, a kill, a crash).

For every running sandbox the backend names the host process whose exit is its death; a pidfd of it
sits in the event loop (it works for processes that are not our children, so re-adopted sandboxes
are watched too). When it fires, ``on_exit`` is called with the sandbox's id: the service decides
whether that was a death (see :meth:`stasis.daemon.core.service.SandboxService.died`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable


class Watchdog:
    def __init__(self, on_exit: Callable[[str], Awaitable[None]]) -> None:
        self.on_exit = on_exit
        self._fds: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(self, sandbox_id: str, pid: int | None) -> None:
        """Watch ``pid`` as the sandbox's host process from now on (replacing an earlier watch of it)."""
        self.forget(sandbox_id)
        if pid is None:
            return
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            self._spawn(sandbox_id)
            return
        asyncio.get_running_loop().add_reader(fd, self._fired, sandbox_id, fd)
        self._fds[sandbox_id] = fd

    def forget(self, sandbox_id: str) -> None:
        fd = self._fds.pop(sandbox_id, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        """Stop watching; a death noticed but not yet recorded is left for the next daemon's recovery."""
        for sandbox_id in list(self._fds):
            self.forget(sandbox_id)
        for task in self._tasks:
            task.cancel()

    def _fired(self, sandbox_id: str, fd: int) -> None:
        if self._fds.get(sandbox_id) == fd:
            self.forget(sandbox_id)
            self._spawn(sandbox_id)

    def _spawn(self, sandbox_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self.on_exit(sandbox_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
