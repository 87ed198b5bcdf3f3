"""The reaper, the one end of every sandbox's life: suspends (or terminates) a sandbox nobody used for its
``timeout_secs``, or whose lifetime (``lifetime_secs``, E2B's timeout) reached its deadline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ...models import SandboxInfo, SandboxStatus
from ..core.activity import idle_action
from ..core.service import SandboxService
from .checkpointing import Checkpoints

log = logging.getLogger(__name__)

S = SandboxStatus
IDLE_TICK = 0.5  # seconds between looks for idle sandboxes


class IdleReaper:
    def __init__(
        self,
        service: SandboxService,
        checkpoints: Checkpoints,
        to_store: Callable[[str], Awaitable[object]] | None = None,
    ) -> None:
        """``to_store`` (a fleet's setting, ``STASIS_IDLE_TO_STORE=1``): an idle-suspended sandbox goes on to the
        remote store, so it outlives this host; any node resumes it at its next request."""
        self.service = service
        self.checkpoints = checkpoints
        self.to_store = to_store
        self._task: asyncio.Task[None] | None = None
        self._busy: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(IDLE_TICK)
            ticks += 1
            try:
                self.tick(persist=ticks % 30 == 0, expire=ticks % 10 == 0)
            except Exception:  # the reaper must outlive any one bad tick
                log.exception("idle reaper tick failed")

    def tick(self, persist: bool = False, expire: bool = False) -> list[asyncio.Task[None]]:
        """Act on every sandbox idle or past its deadline; the actions run on as tasks (a test awaits them)."""
        service, started = self.service, []
        if persist:
            service.persist_activity()
        if expire:
            self.checkpoints.expire()
        for info in service.records(status=S.RUNNING):  # not every suspended one, twice a second
            if info.id not in self._busy and service.activity.due(info):
                self._busy.add(info.id)
                task = asyncio.get_running_loop().create_task(self._act(info))
                task.add_done_callback(lambda _t, sid=info.id: self._busy.discard(sid))
                started.append(task)
        return started

    async def _act(self, info: SandboxInfo) -> None:
        action, service = idle_action(info), self.service
        try:
            if action == "terminate":
                acted = (await service.terminate(info.id, only_if_due=True)).status == S.TERMINATED
            else:
                acted = (await service.suspend(info.id, only_if_due=True)).status == S.SUSPENDED
            if acted:
                service.metrics.idle_actions.labels(action).inc()
            if acted and action == "suspend" and self.to_store is not None:
                await self.to_store(info.id)
                log.info("idle %s went to the remote store", info.id)
        except Exception as exc:  # a failed idle suspend leaves the sandbox running, with the error on record
            log.warning("idle %s of %s failed: %s", action, info.id, exc)
            service.metrics.idle_failures.inc()
