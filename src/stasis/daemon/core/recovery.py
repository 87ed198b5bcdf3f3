"""Recovery after a daemon restart, as data: (what the store says, what the host shows) → a plan.

Every lifecycle operation writes its intent before touching the host, so a daemon
killed at any instant leaves a stored state that says what it was doing. On start,
each sandbox's stored state is paired with its backend's view of the host and looked
up in ``RECOVERY``; the plan finishes the operation or rolls it back. Every pair has a
row (a test checks it), so nothing is ever left half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
from collections.abc import Awaitable, Callable

from ...backends.base import BoxRef, HostState
from ...models import SandboxInfo, SandboxStatus
from .service import SandboxService
from .states import COLD_SUSPEND

log = logging.getLogger(__name__)

S, H = SandboxStatus, HostState
RECOVERY_TIMEOUT = 120.0  # seconds for one sandbox


class Plan(enum.Enum):
    DISCARD = "roll the create back: nothing stays on the host"
    TERMINATE = "finish removing it"
    ADOPT = "it runs: reconnect and record running"
    SALVAGE = "restore it from the suspend image that was written but not sealed; failed if that does not load"
    COMPLETE_SUSPEND = "stop what is left, record suspended"
    BACK_TO_SUSPENDED = "stop what is left, record suspended again"
    KEEP_SUSPENDED = "stop anything that runs for it"
    FAIL = "stop what is left, keep its files, record failed with the reason"
    STOP = "stop anything that runs for it; keep its state"


LOST = "its processes were gone when the daemon started (host restart or crash); resuming boots it again with its files"

RECOVERY: dict[tuple[SandboxStatus, HostState], tuple[Plan, str]] = {
    **{(S.PENDING, h): (Plan.DISCARD, "the daemon stopped while the sandbox was being created") for h in H},
    **{(S.TERMINATING, h): (Plan.TERMINATE, "removal finished after a daemon restart") for h in H},
    **{(S.TERMINATED, h): (Plan.STOP, "already removed") for h in H},
    **{(S.FAILED, h): (Plan.STOP, "nothing runs for a failed sandbox") for h in H},
    (S.RUNNING, H.RUNNING): (Plan.ADOPT, "re-adopted after daemon restart"),
    (S.RUNNING, H.SUSPENDED): (Plan.COMPLETE_SUSPEND, "found suspended on the host"),
    (S.RUNNING, H.PARTIAL): (Plan.SALVAGE, "a suspend was cut off; restored from its image"),
    (S.RUNNING, H.STOPPED): (Plan.FAIL, LOST),
    (S.SUSPENDING, H.RUNNING): (Plan.ADOPT, "suspend cut off before the sandbox stopped; it goes on"),
    (S.SUSPENDING, H.SUSPENDED): (Plan.COMPLETE_SUSPEND, "suspend completed during recovery"),
    (S.SUSPENDING, H.PARTIAL): (Plan.SALVAGE, "suspend was cut off; restored from its image"),
    (S.SUSPENDING, H.STOPPED): (Plan.FAIL, LOST),
    (S.SNAPSHOTTING, H.RUNNING): (Plan.ADOPT, "checkpoint cut off; the sandbox goes on"),
    (S.SNAPSHOTTING, H.SUSPENDED): (Plan.FAIL, "the sandbox stopped during a checkpoint"),
    (S.SNAPSHOTTING, H.PARTIAL): (Plan.FAIL, "the sandbox stopped during a checkpoint"),
    (S.SNAPSHOTTING, H.STOPPED): (Plan.FAIL, "the sandbox stopped during a checkpoint"),
    (S.RESUMING, H.RUNNING): (Plan.ADOPT, "resume completed during recovery"),
    (S.RESUMING, H.SUSPENDED): (Plan.BACK_TO_SUSPENDED, "resume rolled back during recovery"),
    (S.RESUMING, H.PARTIAL): (Plan.FAIL, "a resume was interrupted; resume to boot it with its files"),
    (S.RESUMING, H.STOPPED): (Plan.FAIL, "a cold boot was interrupted; resume to retry"),
    (S.SUSPENDED, H.RUNNING): (Plan.KEEP_SUSPENDED, "nothing may run for a suspended sandbox"),
    (S.SUSPENDED, H.SUSPENDED): (Plan.KEEP_SUSPENDED, "still suspended"),
    (S.SUSPENDED, H.PARTIAL): (Plan.FAIL, "its suspend image is missing"),
    (S.SUSPENDED, H.STOPPED): (Plan.FAIL, "its suspend image is missing"),
}


class Recovery:
    def __init__(self, service: SandboxService, first: list[Callable[[], Awaitable[None]]] | None = None) -> None:
        """``first`` run before the sandboxes are recovered: the rooms' own settling (cut-off checkpoints
        removed, cut-off pushes settled against the remote store: one the store took over is not kept here)."""
        self.service = service
        self.store = service.store
        self.first = first or []

    async def run(self) -> None:
        """Make the store and the host agree after a restart, sandbox by sandbox."""
        for settle in self.first:
            await settle()
        await asyncio.gather(*(self._recover_bounded(info) for info in self.store.list()))
        try:
            await self._sweep()
        except Exception:  # a host command that hangs must not keep the daemon from serving
            log.exception("sweeping leftovers failed; the daemon serves anyway")

    async def _recover_bounded(self, info: SandboxInfo) -> None:
        """One sandbox's recovery; whatever it does (a runsc call that hangs), it cannot block the others."""
        try:
            await asyncio.wait_for(self.recover(info), RECOVERY_TIMEOUT)
        except Exception as exc:
            log.exception("recovery of %s failed", info.id)
            with contextlib.suppress(Exception):
                self.store.transition(info.id, S.FAILED, error=f"recovery failed: {exc!r}; `stasis rm` removes it")

    async def recover(self, info: SandboxInfo) -> None:
        service = self.service
        backend, box = service.backend_of(info), service.boxes.box_or_bare(info)
        host = await backend.host_state(box)
        if info.status == S.SUSPENDED and info.runtime.get(COLD_SUSPEND) and host in (H.STOPPED, H.PARTIAL):
            host = H.SUSPENDED  # suspended without memory: its files are all it keeps, and a resume boots it
        plan, detail = RECOVERY[(info.status, host)]
        log.info("recovering %s: store says %s, host says %s: %s", info.id, info.status.value, host.value, plan.name)
        if plan is Plan.DISCARD:
            await service.discard(info, box, detail)
        elif plan is Plan.TERMINATE:
            await service.terminate(info.id, pooled=True)
        elif plan is Plan.ADOPT:
            await service.attach_network(info)
            await service.adopt_channel(info, await backend.connect(box), detail)
        elif plan is Plan.SALVAGE:
            await self._salvage(info, box, detail)
        elif plan is Plan.FAIL:
            await backend.stop(box)
            self.store.transition(info.id, S.FAILED, error=detail)
        else:
            await backend.stop(box)
            if plan is Plan.COMPLETE_SUSPEND and info.status == S.RUNNING:
                self.store.transition(info.id, S.SUSPENDING, detail)
            if plan in (Plan.COMPLETE_SUSPEND, Plan.BACK_TO_SUSPENDED):
                self.store.transition(info.id, S.SUSPENDED, detail)

    async def _salvage(self, info: SandboxInfo, box: BoxRef, detail: str) -> None:
        backend = self.service.backend_of(info)
        try:
            await self.service.attach_network(info)
            channel = await backend.resume(box)
        except Exception as exc:
            log.warning("could not salvage %s from its unsealed suspend image: %s", info.id, exc)
            await backend.stop(box)
            self.store.transition(info.id, S.FAILED, error=LOST)
            return
        await self.service.adopt_channel(info, channel, detail)

    async def _sweep(self) -> None:
        """Reap what runs on the host, and directories, that no live sandbox owns."""
        live = {info.id for info in self.store.list()}
        for backend in self.service.backends.values():
            await backend.sweep(live)
        await self.service.network.sweep(live)
        sandboxes = self.service.paths.sandboxes
        for directory in sandboxes.iterdir() if sandboxes.exists() else []:
            if directory.name not in live:
                log.warning("removing %s: no live sandbox owns it", directory)
                shutil.rmtree(directory, ignore_errors=True)
