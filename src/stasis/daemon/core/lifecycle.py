"""The lifecycle operations of :class:`~.service.SandboxService`: create, suspend, resume, terminate, and
what a host-side death or a daemon restart does. Each state change runs inside :meth:`Lifecycle.operation`
(:mod:`.operation`): the lock held, the intent written, the body run, the outcome written or the one
rollback rule applied. Rooms that change a sandbox's state (checkpoints) use the same primitive."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from ... import faults, tracing
from ...backends.base import Backend, BoxRef, FromCheckpoint, HostState
from ...errors import SandboxNotFound, Unsupported
from ...fsutil import no_space
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ...images import ImageStore
from ...models import CheckpointType, SandboxInfo, SandboxSpec, SandboxStatus
from ...network.engine import NetworkEngine
from .activity import Activity
from .boxes import Boxes
from .checkpoints import CheckpointFiles
from .metrics import Metrics
from .operation import OUTCOMES, POINTS, SPANS, VERBS, Step, rollback_target
from .sources import Restore, Source
from .states import COLD_SUSPEND, require
from .store import Store
from .watchdog import Watchdog

log = logging.getLogger(__name__)

S = SandboxStatus
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
FORCE_AFTER = 10.0  # seconds a removal waits for another operation on the sandbox
TeardownHook = Callable[[str], Awaitable[None]]
StoppingHook = Callable[[str], None]  # run in a worker thread
ReadyHook = Callable[[SandboxInfo, GuestChannel], Awaitable[None]]


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


class Lifecycle:
    """The state-changing half of the core; :class:`~.service.SandboxService` adds reading, the guest and
    start-up. The attributes are the service's (set in its constructor)."""

    store: Store
    images: ImageStore
    checkpoint_files: CheckpointFiles
    activity: Activity
    metrics: Metrics
    network: NetworkEngine
    boxes: Boxes
    watchdog: Watchdog
    _teardown_hooks: list[TeardownHook]
    _ready_hooks: list[ReadyHook]
    _stopping_hooks: list[StoppingHook]
    _admit: Callable[[SandboxSpec, str | None], None]  # a team's quotas: raises to refuse a start
    _lifetime_cap: Callable[[str | None], int | None]  # a team's longest lifetime, if it has one
    _channels: dict[str, GuestChannel]
    _locks: dict[str, asyncio.Lock]

    backends: dict[str, Backend]
    unavailable: dict[str, str]

    # ------------------------------------------------------------ what every operation looks up

    def lookup(self, ref: str, *, pooled: bool = False) -> SandboxInfo:
        """The stored record of ``ref`` as a client may name it: a waiting pool member is nobody's sandbox
        yet (no exec, suspend or file in it before it is claimed); only the pools pass ``pooled``."""
        info = self.store.get(ref)
        if info.pool is not None and not pooled:
            raise SandboxNotFound(f"no sandbox named or with id {ref[:80]!r}; `stasis ls` lists them", ref=ref[:80])
        return info

    def present(self, info: SandboxInfo) -> SandboxInfo:
        """The stored record with what only memory knows: last use, the idle deadline, the backend's view."""
        backend = self.backends.get(info.spec.backend)
        return self.activity.present(info, backend.describe if backend is not None else None)

    def backend_of(self, info: SandboxInfo) -> Backend:
        return self.available(info.spec.backend)

    def available(self, backend: str) -> Backend:
        """The backend named, or Unsupported saying why this host lacks it."""
        if backend not in self.backends:
            why = self.unavailable.get(backend, "unknown backend")
            raise Unsupported(f"backend {backend!r} is not available on this host: {why}")
        return self.backends[backend]

    async def channel(self, info: SandboxInfo) -> GuestChannel:
        channel = self._channels.get(info.id)
        if channel is None or channel.closed:
            channel = await self.backend_of(info).connect(self.boxes.box(info))
            self._channels[info.id] = channel
        return channel

    # ------------------------------------------------------------ the primitive

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises lifecycle operations on one sandbox."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def locked(self, ref: str, *, pooled: bool = False) -> AsyncIterator[SandboxInfo]:
        """The sandbox's record, read fresh under its lock, held while the block runs: nothing else changes
        its state meanwhile (a room moving its files to the remote store holds it so)."""
        info = self.lookup(ref, pooled=pooled)
        async with self.lock(info.id):
            yield self.store.get(info.id)

    @contextlib.asynccontextmanager
    async def operation(
        self, info: SandboxInfo, intent: SandboxStatus, detail: str | None = None
    ) -> AsyncIterator[Step]:
        """One state change of ``info`` (its lock held by the caller, :meth:`locked`): the intent written
        (a create's insert wrote it already), its fault point, the block, then the outcome with the step's
        ``detail`` and ``fields``. A block that raises is rolled back (:meth:`_roll_back`) and the error
        goes on."""
        after_intent, before_outcome = POINTS[intent]
        created = info.status == S.PENDING and intent == S.PENDING
        backend = self.backend_of(info)
        step = Step(info, intent, backend, self.boxes.box(info), before=None if created else info.status)
        with tracing.span(SPANS[intent], info.id, info.spec.team, **{"stasis.backend": info.spec.backend}):
            if not created:
                self.store.transition(info.id, intent, detail)
            faults.point(after_intent)
            try:
                yield step
            except BaseException as exc:
                await self._roll_back(step, exc)
                raise
            if step.channel is not None:
                self._channels[info.id] = step.channel
            faults.point(before_outcome)
            step.info = self.store.transition(info.id, OUTCOMES[intent], step.detail, **step.fields)

    async def _roll_back(self, step: Step, exc: BaseException) -> None:
        info, backend, box = step.info, step.backend, step.box
        why = f"{VERBS[step.intent]} failed: {exc}"
        if step.before is None:
            await self.discard(info, box, why)
            return
        host = await backend.host_state(box)
        channel = None
        if step.before == S.RUNNING:
            channel = await self._reconnect(step, host)
        else:
            with contextlib.suppress(Exception):
                await backend.stop(box)  # whatever the operation started
        target = rollback_target(step.before, host, channel is not None)
        if target == S.FAILED and step.before == S.RUNNING:
            with contextlib.suppress(Exception):
                await backend.stop(box)
            why += "; the sandbox stopped"
        self.store.transition(info.id, target, f"{VERBS[step.intent]} rolled back", error=why)
        if channel is not None:
            self._channels[info.id] = channel
            await self._watch(info)

    async def _reconnect(self, step: Step, host: HostState) -> GuestChannel | None:
        """A running sandbox's channel after a failed operation: a checkpoint's open one, or a new one (after a
        suspend, connecting is what un-pauses the guest), or (a suspend that stopped it after writing its image)
        the sandbox resumed from that image; None if none answers."""
        current = self._channels.pop(step.info.id, None)
        keep = step.intent == S.SNAPSHOTTING and current is not None and not current.closed
        if current is not None and not keep:
            with contextlib.suppress(Exception):
                await current.close()
        with contextlib.suppress(Exception):
            if host == HostState.RUNNING:
                return current if keep else await step.backend.connect(step.box)
            if host == HostState.PARTIAL:
                return await step.backend.resume(step.box)
        return None

    # ------------------------------------------------------------ the operations

    async def create(
        self, name: str | None, source: Source, *, pool: str | None = None, forked_from: str | None = None
    ) -> SandboxInfo:
        """A new sandbox from ``source`` (a boot, or a checkpoint of this node's); ``pool`` makes it a waiting
        member of that pool; ``forked_from`` names a fork's parent. Refused before anything exists on the
        host; rolled back (nothing left) if the start fails."""
        backend = self.available(source.spec.backend)
        self.images.rootfs_by_key(source.image_key)  # the exact build, pinned
        checkpoint = source.checkpoint if isinstance(source, Restore) else None
        if checkpoint is not None and source.verify:
            await asyncio.to_thread(self.checkpoint_files.verify, checkpoint.id, checkpoint.sha256)
        from_checkpoint = checkpoint.id if checkpoint else None
        spec = source.spec
        if (cap := self._lifetime_cap(spec.team)) is not None and (spec.lifetime_secs or cap + 1) > cap:
            spec = spec.model_copy(update={"lifetime_secs": cap})  # its team's quota, whatever asked for more
        self._admit(spec, None)  # no await between this and the row: two creates cannot both slip in
        info = self.store.insert_sandbox(
            new_id("sb-"), name, spec, source.image_key, from_checkpoint, pool, forked_from
        )
        started = time.monotonic()
        async with self.lock(info.id):
            async with self.operation(info, S.PENDING) as step:
                await self.attach_network(info)
                start = None if checkpoint is None else FromCheckpoint(
                    self.checkpoint_files.path(checkpoint.id), checkpoint.type == CheckpointType.MEMORY,
                    checkpoint.runtime,
                )  # fmt: skip
                step.channel, state = await backend.start(step.box, start)
                step.detail = f"from checkpoint {checkpoint.id}" if checkpoint else "started"
                step.fields = {"backend_state": state.model_dump(mode="json"), **self._lifetime(info)}
            info = await self._running(step.info)
        self.metrics.create_seconds.observe(time.monotonic() - started)
        log.info("created %s (%s) in %.3fs", info.id, info.name, time.monotonic() - started)
        return self.present(info)

    def _lifetime(self, info: SandboxInfo) -> dict[str, float]:
        """A new lifetime from now, for a sandbox that has one (its ``lifetime_secs``)."""
        seconds = info.spec.lifetime_secs
        return {} if seconds is None else {"deadline": self.activity.clock() + seconds}

    async def _running(self, info: SandboxInfo) -> SandboxInfo:
        """After a start or resume: watched, set up by the ready hooks (one that fails is logged, and the sandbox
        runs on: what it set up fails closed), a fresh idle window."""
        await self._watch(info)
        for hook in self._ready_hooks:
            try:
                await hook(info, self._channels[info.id])
            except Exception:
                log.exception("%s: setting up after its start failed", info.id)
        self.activity.touch(info.id)
        return info

    async def discard(self, info: SandboxInfo, box: BoxRef, reason: str) -> None:
        """Roll back a create: nothing stays on the host, the record says why."""
        with contextlib.suppress(Exception):
            await self.backend_of(info).stop(box, remove=True)
        with contextlib.suppress(Exception):
            await self.network.detach(info.id)
        if self.store.get(info.id).status != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        self.store.transition(info.id, S.TERMINATED, reason, error=reason)

    async def suspend(self, ref: str, *, only_if_due: bool = False, keep_memory: bool | None = None) -> SandboxInfo:
        """Its memory, processes and files to disk; it costs no CPU or RAM until resumed. ``only_if_due``: the
        reaper's, done only if it is still idle or past its deadline when its turn comes. ``keep_memory`` False
        (default: its spec's): its files only, a stop; the next resume boots it again with them (E2B's
        filesystem-only pause). Fast storage keeps its files in its kernel, so it is always suspended whole."""
        async with self.locked(ref) as info:
            if info.status == S.SUSPENDED:
                return self.present(info)
            require(info, S.RUNNING)
            channel = await self.channel(info)
            if only_if_due and not self.activity.due(info):
                return self.present(info)  # used since the reaper looked: no await between this and the intent
            keep = info.spec.keep_memory if keep_memory is None else keep_memory
            cold = not keep and info.spec.storage != "fast"
            started = time.monotonic()
            how = ", files only" if cold else ""
            why = ", ".join(word for word, said in (("idle", only_if_due), ("files only", cold)) if said) or None
            async with self.operation(info, S.SUSPENDING, why) as step:
                self.watchdog.forget(info.id)
                await self._stopping(info.id)
                try:
                    if cold:
                        await self._stop_keeping_files(step, channel)
                    else:
                        await step.backend.suspend(step.box, channel)
                except BaseException as exc:
                    if (full := no_space(exc, step.box.directory)) is not exc:
                        raise full from exc
                    raise
                self._channels.pop(info.id, None)
                elapsed = time.monotonic() - started
                step.detail = f"{elapsed:.3f}s{how}"
                step.fields = {"last_suspend_seconds": elapsed, **step.fields}
        self.metrics.suspend_seconds.observe(elapsed)
        log.info("suspended %s in %.3fs%s%s", info.id, elapsed, " (idle)" if only_if_due else "", how)
        return self.present(step.info)

    async def _stop_keeping_files(self, step: Step, channel: GuestChannel) -> None:
        """A suspend without memory: its writes on disk (a guest's page cache flushed), then a stop."""
        with contextlib.suppress(Exception):  # a guest that does not answer is stopped all the same
            await channel.call(P.Exec(cmd=["sync"]), timeout=60)
        await step.backend.stop(step.box)
        step.fields["backend_state"] = {**step.info.runtime, COLD_SUSPEND: True}

    async def resume(self, ref: str) -> SandboxInfo:
        """A suspended sandbox of this node's back exactly where it was (a failed one whose files survived
        boots again with them). One in the remote store is the layer above's (:mod:`..rooms.front`)."""
        async with self.locked(ref) as info:
            if info.status == S.RUNNING:
                return self.present(info)
            # A failed sandbox whose files survived (e.g. the host rebooted under it) boots again with them, as
            # does one suspended without its memory.
            cold = info.status == S.FAILED and self.boxes.box(info).directory.exists()
            cold = cold or (info.status == S.SUSPENDED and bool(info.runtime.get(COLD_SUSPEND)))
            if not cold:
                require(info, S.SUSPENDED)
            self._admit(info.spec, info.id)
            started = time.monotonic()
            async with self.operation(info, S.RESUMING, "cold boot with its files" if cold else None) as step:
                await self.attach_network(info)
                if cold:
                    step.channel, state = await step.backend.start(step.box)
                    backend_state = state.model_dump(mode="json")
                else:
                    step.channel, backend_state = await step.backend.resume(step.box), info.runtime
                elapsed = time.monotonic() - started
                step.detail = f"{elapsed:.3f}s"
                step.fields = {"last_resume_seconds": elapsed, "backend_state": backend_state, **self._lifetime(info)}
            info = await self._running(step.info)
        self.metrics.resume_seconds.observe(elapsed)
        log.info("resumed %s in %.3fs", info.id, elapsed)
        return self.present(info)

    async def terminate(self, ref: str, *, only_if_due: bool = False, pooled: bool = False) -> SandboxInfo:
        """Remove the sandbox and its files. It always works: an operation stuck on it (a runsc call
        that hangs) is waited for ``FORCE_AFTER`` seconds, then the removal goes ahead without it."""
        info = self.lookup(ref, pooled=pooled)
        async with self._lock_or_force(info.id, wait=not only_if_due):
            info = self.store.get(info.id)
            if info.status == S.TERMINATED:
                return self.present(info)
            if only_if_due and (info.status != S.RUNNING or not self.activity.due(info)):
                return self.present(info)
            info = await self._teardown(info)
        log.info("terminated %s%s", info.id, " (idle)" if only_if_due else "")
        return self.present(info)

    async def leave(self, info: SandboxInfo, moved_to: str) -> SandboxInfo:
        """The remote store owns the sandbox now: remove this node's copy, recording where it went (a
        restart finishes this if cut off). The caller holds the sandbox's lock, or runs before serving."""
        if info.status == S.TERMINATED:
            return info
        return await self._teardown(info, moved_to=moved_to)

    async def _teardown(self, info: SandboxInfo, moved_to: str | None = None) -> SandboxInfo:
        """The one way a sandbox ends here: intent, its channel, its host side, what features hold of it,
        its network, outcome. It has no rollback: a removal always goes through (a restart finishes it)."""
        reason = f"moved to {moved_to}" if moved_to else None
        if info.status != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        faults.point("terminate.after_intent")
        self.watchdog.forget(info.id)
        await self.drop_channel(info.id)
        faults.point("terminate.after_close")
        await self._stopping(info.id)
        await self.backend_of(info).stop(self.boxes.box_or_bare(info), remove=True)
        for hook in self._teardown_hooks:
            await hook(info.id)
        await self.network.detach(info.id)
        faults.point("terminate.before_outcome")
        info = self.store.transition(info.id, S.TERMINATED, reason, moved_to=moved_to)
        self._locks.pop(info.id, None)
        self.activity.forget(info.id)
        return info

    async def died(self, sandbox_id: str) -> None:
        """Its host process exited: if the store still says running and nothing runs on the host, the sandbox
        is ``failed`` with the backend's reason, every waiting request fails now with it, and what is left
        of it on the host is stopped."""
        async with self.lock(sandbox_id):
            info = self.store.get(sandbox_id)
            if info.status != S.RUNNING:
                return  # a suspend or removal stopped it on purpose
            backend, box = self.backend_of(info), self.boxes.box_or_bare(info)
            if await backend.host_state(box) == HostState.RUNNING:
                return
            reason = backend.stop_reason(box)
            log.warning("sandbox %s died on the host: %s", sandbox_id, reason)
            self.store.transition(sandbox_id, S.FAILED, error=reason)
            await self.drop_channel(sandbox_id)  # waiters fail now, with the reason on record
            await self._stopping(sandbox_id)  # its cgroup outlives it until the stop below
            with contextlib.suppress(Exception):
                await backend.stop(box)

    async def _stopping(self, sandbox_id: str) -> None:
        """The last moment a sandbox's host processes can be read (what the meter counts of them)."""
        for hook in self._stopping_hooks:
            try:
                await asyncio.to_thread(hook, sandbox_id)
            except Exception:
                log.exception("a hook failed as sandbox %s stops", sandbox_id)

    async def drop_channel(self, sandbox_id: str) -> None:
        channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            await channel.close()

    async def _watch(self, info: SandboxInfo) -> None:
        self.watchdog.watch(info.id, await self.backend_of(info).host_pid(self.boxes.box_or_bare(info)))

    @contextlib.asynccontextmanager
    async def _lock_or_force(self, sandbox_id: str, wait: bool) -> AsyncIterator[None]:
        lock = self.lock(sandbox_id)
        try:
            await asyncio.wait_for(lock.acquire(), FORCE_AFTER if wait else None)
        except TimeoutError:
            log.warning("removing %s while another operation on it is stuck", sandbox_id)
            yield
            return
        try:
            yield
        finally:
            lock.release()

    async def attach_network(self, info: SandboxInfo) -> None:
        """Its namespaces, firewall and the daemon's sockets in them, before its kernel boots (or after a
        daemon restart, for one that runs); nothing for a sandbox without network."""
        if info.spec.network is not None:
            await self.network.attach(info.id, info.spec.network, self.backend_of(info).network_device)

    async def adopt_channel(self, info: SandboxInfo, channel: GuestChannel, detail: str) -> None:
        """Take over a sandbox found running (after a daemon restart) on ``channel``."""
        self._channels[info.id] = channel
        self.activity.touch(info.id)  # a restarted daemon gives every sandbox a full idle window
        if info.status != S.RUNNING:
            self.store.transition(info.id, S.RUNNING, detail)
        await self._watch(info)
