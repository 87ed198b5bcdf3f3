"""Noticing at once when a running sandbox dies on the host (the OOM killer, a kill, a crash).

For every running sandbox the backend names the host process whose exit is its death; a
pidfd of it sits in the event loop (it works for processes that are not our children, so
re-adopted sandboxes are watched too). When it fires and the store still says running, the
sandbox becomes ``failed`` with the backend's reason, its channel is closed so that every
waiting request fails now with that reason, and what is left of it on the host is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING

from ..backends.base import HostState
from ..models import SandboxStatus

if TYPE_CHECKING:
    from .service import SandboxService

log = logging.getLogger(__name__)

S = SandboxStatus


class Watchdog:
    def __init__(self, service: SandboxService) -> None:
        self.service = service
        self._fds: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def watch(self, sandbox_id: str) -> None:
        """Watch the sandbox's host process from now on (replacing an earlier watch of it)."""
        self.forget(sandbox_id)
        service = self.service
        info = service.store.get(sandbox_id)
        pid = await service.backend_of(info).host_pid(service.box_or_bare(info))
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
        task = asyncio.get_running_loop().create_task(self.died(sandbox_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def died(self, sandbox_id: str) -> None:
        """Record the death of a sandbox whose processes are gone (no-op if it runs, or is not running)."""
        service = self.service
        async with service.lock(sandbox_id):
            info = service.store.get(sandbox_id)
            if info.status != S.RUNNING:
                return  # a suspend or removal stopped it on purpose
            backend, box = service.backend_of(info), service.box_or_bare(info)
            if await backend.host_state(box) == HostState.RUNNING:
                return
            reason = backend.stop_reason(box)
            log.warning("sandbox %s died on the host: %s", sandbox_id, reason)
            service.store.transition(sandbox_id, S.FAILED, error=reason)
            await service.drop_channel(sandbox_id)  # waiters fail now, with the reason on record
            with contextlib.suppress(Exception):
                await backend.stop(box)
