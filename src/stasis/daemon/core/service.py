"""The lifecycle core: owns every sandbox's locks, store transitions, channels and backend, and one
teardown. Nothing of pools, templates, exposed ports, the remote store or any face (HTTP, MCP, the
console) is here: they sit above it, and a create gets where the sandbox comes from as a value
(:mod:`.sources`) from them.

Lifecycle operations on one sandbox (create, suspend, resume, terminate, checkpoint) are serialised
by a per-sandbox lock; different sandboxes proceed in parallel. Commands and file operations
(:mod:`.operations`) run concurrently on a running sandbox, inside :meth:`SandboxService.guest`.

Each lifecycle operation writes its intent to the store before touching the host and its outcome
after, so :mod:`.recovery` can finish or roll back whatever a killed daemon left half-done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ... import faults
from ...backends import BACKENDS, create_backend
from ...backends.base import Backend, BoxRef, FromCheckpoint, HostState
from ...errors import GuestDisconnected, SandboxNotFound, StasisError, StateError, Unsupported
from ...fsutil import no_space
from ...guest.client import GuestChannel
from ...images import ImageStore
from ...models import CheckpointType, SandboxInfo, SandboxStatus
from ...network.audit import EgressAudit
from ...network.engine import NetworkEngine
from ...paths import Paths
from .activity import Activity, Clock
from .boxes import Boxes
from .checkpoints import CheckpointFiles
from .metrics import Metrics
from .sources import Restore, Source
from .states import require
from .store import Store
from .watchdog import Watchdog

log = logging.getLogger(__name__)

S = SandboxStatus
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
FORCE_AFTER = 10.0  # seconds a removal waits for another operation on the sandbox
TeardownHook = Callable[[str], Awaitable[None]]
ReadyHook = Callable[[SandboxInfo, GuestChannel], Awaitable[None]]


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


class SandboxService:
    def __init__(self, paths: Paths, backends: dict[str, Backend] | None = None, clock: Clock = time.time) -> None:
        """``backends`` replaces the registry's (a test's fake); otherwise every registered one is tried.
        ``clock`` is the wall clock idle times are read from (the fast tests' own)."""
        self.paths = paths
        self.store = Store(paths.database)
        self.images = ImageStore(paths.images)
        self.checkpoint_files = CheckpointFiles(paths.home / "checkpoints")
        self.backends: dict[str, Backend] = dict(backends or {})
        self._given_backends = backends is not None
        self.unavailable: dict[str, str] = {}  # backend -> why it does not work here
        self.activity = Activity(clock)
        self.metrics = Metrics()
        self.network = NetworkEngine(paths.runtime.name, self.activity.touch, EgressAudit(paths.sandboxes.joinpath))
        self.boxes = Boxes(paths, self.images, self.network)
        self.watchdog = Watchdog(self.died)
        # what features above hold of a sandbox (its exposed ports' listeners) goes with it
        self.teardown_hooks: list[TeardownHook] = []
        # what features above put into a sandbox each time it starts on this node (its secrets' CA)
        self.ready_hooks: list[ReadyHook] = []
        self._channels: dict[str, GuestChannel] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._serving = contextlib.AsyncExitStack()  # the backends', while the daemon serves

    # ------------------------------------------------------------ start-up and shutdown

    async def start(self) -> None:
        names = list(self.backends) if self._given_backends else list(BACKENDS)
        for name in names:
            try:
                backend = self.backends.get(name) or create_backend(name, self.paths)
                await self._serving.enter_async_context(backend.serving())
            except StasisError as exc:  # a host without QEMU still serves gVisor sandboxes, and vice versa
                log.warning("backend %s is unavailable: %s", name, exc)
                self.unavailable[name] = str(exc)
                self.backends.pop(name, None)
                continue
            self.backends[name] = backend
        if not self.backends:
            raise StasisError(f"no backend works on this host: {self.unavailable}")

    async def close(self) -> None:
        """Stop serving. Sandboxes keep running; the next daemon re-adopts them."""
        self.activity.persist(self.store)
        self.watchdog.close()
        self.network.close()
        for channel in list(self._channels.values()):
            await channel.close()
        self._channels.clear()
        await self._serving.aclose()
        self.store.close()

    def describe_backends(self) -> dict[str, dict[str, Any]]:
        described = {name: backend.describe() for name, backend in self.backends.items()}
        return described | {name: {"backend": name, "unavailable": why} for name, why in self.unavailable.items()}

    # ------------------------------------------------------------ reading

    def get(self, ref: str) -> SandboxInfo:
        return self.present(self.lookup(ref))

    def lookup(self, ref: str, *, pooled: bool = False) -> SandboxInfo:
        """The stored record of ``ref`` as a client may name it: a waiting pool member is nobody's sandbox
        yet (no exec, suspend or file in it before it is claimed); only the pools pass ``pooled``."""
        info = self.store.get(ref)
        if info.pool is not None and not pooled:
            raise SandboxNotFound(f"no sandbox named or with id {ref[:80]!r}; `stasis ls` lists them", ref=ref[:80])
        return info

    def list(
        self, include_terminated: bool = False, limit: int | None = None, after: tuple[float, str] | None = None
    ) -> list[SandboxInfo]:
        infos = self.store.list(include_terminated, include_pooled=False, limit=limit, after=after)
        return [self.present(info) for info in infos]

    def present(self, info: SandboxInfo) -> SandboxInfo:
        """The stored record with what only memory knows: last use, the idle deadline, the backend's view."""
        backend = self.backends.get(info.spec.backend)
        return self.activity.present(info, backend.describe if backend is not None else None)

    # ------------------------------------------------------------ helpers

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises lifecycle operations on one sandbox."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def drop_channel(self, sandbox_id: str) -> None:
        channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            await channel.close()

    def backend_of(self, info: SandboxInfo) -> Backend:
        return self.available(info.spec.backend)

    def available(self, backend: str) -> Backend:
        """The backend named, or Unsupported saying why this host lacks it."""
        if backend not in self.backends:
            why = self.unavailable.get(backend, "unknown backend")
            raise Unsupported(f"backend {backend!r} is not available on this host: {why}")
        return self.backends[backend]

    # ------------------------------------------------------------ lifecycle

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
        info = self.store.insert(new_id("sb-"), name, source.spec, source.image_key, from_checkpoint, pool, forked_from)
        async with self.lock(info.id):
            box = self.boxes.box(info)
            faults.point("create.after_intent")
            started = time.monotonic()
            try:
                await self.attach_network(info)
                start = None if checkpoint is None else FromCheckpoint(
                    self.checkpoint_files.path(checkpoint.id), checkpoint.type == CheckpointType.MEMORY,
                    checkpoint.runtime,
                )  # fmt: skip
                channel, state = await backend.start(box, start)
            except BaseException as exc:
                await self.discard(info, box, f"start failed: {exc}")
                raise
            self._channels[info.id] = channel
            faults.point("create.before_outcome")
            detail = f"from checkpoint {checkpoint.id}" if checkpoint else "started"
            info = self.store.transition(info.id, S.RUNNING, detail, backend_state=state.model_dump(mode="json"))
            await self._watch(info)
            await self._ready(info, channel)
            self.activity.touch(info.id)
            self.metrics.create_seconds.observe(time.monotonic() - started)
            log.info("created %s (%s) in %.3fs", info.id, info.name, time.monotonic() - started)
            return self.present(info)

    async def _ready(self, info: SandboxInfo, channel: GuestChannel) -> None:
        """The ready hooks; one that fails is logged, and the sandbox runs on (what it set up fails closed)."""
        for hook in self.ready_hooks:
            try:
                await hook(info, channel)
            except Exception:
                log.exception("%s: setting up after its start failed", info.id)

    async def discard(self, info: SandboxInfo, box: BoxRef, reason: str) -> None:
        """Roll back a create: nothing stays on the host, the record says why."""
        with contextlib.suppress(Exception):
            await self.backend_of(info).stop(box, remove=True)
        with contextlib.suppress(Exception):
            await self.network.detach(info.id)
        if self.store.get(info.id).status != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        self.store.transition(info.id, S.TERMINATED, reason, error=reason)

    async def suspend(self, ref: str, *, only_if_idle: bool = False) -> SandboxInfo:
        info = self.lookup(ref)
        async with self.lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.SUSPENDED:
                return self.present(info)
            require(info, S.RUNNING)
            backend, box = self.backend_of(info), self.boxes.box(info)
            channel = await self.channel(info)
            if only_if_idle and not self.activity.is_idle(info):
                return self.present(info)  # used since the reaper looked: no await between this and the intent
            self.store.transition(info.id, S.SUSPENDING, "idle" if only_if_idle else None)
            self.watchdog.forget(info.id)
            faults.point("suspend.after_intent")
            started = time.monotonic()
            try:
                await backend.suspend(box, channel)
            except BaseException as exc:
                await self._rollback_suspend(info, box, exc)
                if (full := no_space(exc, box.directory)) is not exc:
                    raise full from exc
                raise
            self._channels.pop(info.id, None)
            elapsed = time.monotonic() - started
            faults.point("suspend.before_outcome")
            info = self.store.transition(info.id, S.SUSPENDED, f"{elapsed:.3f}s", last_suspend_seconds=elapsed)
            self.metrics.suspend_seconds.observe(elapsed)
            log.info("suspended %s in %.3fs%s", info.id, elapsed, " (idle)" if only_if_idle else "")
            return self.present(info)

    async def _rollback_suspend(self, info: SandboxInfo, box: BoxRef, exc: BaseException) -> None:
        """A failed suspend never turns into a kill: back to running if the sandbox still runs."""
        backend = self.backend_of(info)
        self._channels.pop(info.id, None)
        host = await backend.host_state(box)
        with contextlib.suppress(Exception):
            if host == HostState.RUNNING:
                self._channels[info.id] = await backend.connect(box)
            elif host == HostState.PARTIAL:  # it stopped after writing its image: that image brings it back
                self._channels[info.id] = await backend.resume(box)
        if info.id in self._channels:
            self.store.transition(info.id, S.RUNNING, "suspend rolled back", error=f"suspend failed: {exc}")
            await self._watch(info)
        else:
            await backend.stop(box)
            self.store.transition(info.id, S.FAILED, error=f"suspend failed and the sandbox stopped: {exc}")

    async def resume(self, ref: str) -> SandboxInfo:
        """A suspended sandbox of this node's back exactly where it was (a failed one whose files survived
        boots again with them). One in the remote store is the layer above's (:mod:`.front`)."""
        info = self.lookup(ref)
        async with self.lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.RUNNING:
                return self.present(info)
            backend, box = self.backend_of(info), self.boxes.box(info)
            # A failed sandbox whose files survived (e.g. the host rebooted under it) boots again with them.
            cold = info.status == S.FAILED and box.directory.exists()
            if not cold:
                require(info, S.SUSPENDED)
            self.store.transition(info.id, S.RESUMING, "cold boot with its files" if cold else None)
            faults.point("resume.after_intent")
            started = time.monotonic()
            try:
                await self.attach_network(info)
                if cold:
                    channel, state = await backend.start(box)
                    backend_state = state.model_dump(mode="json")
                else:
                    channel, backend_state = await backend.resume(box), info.runtime
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await backend.stop(box)
                # A failure after the guest ran on (a microVM's memory file moved) leaves no image to retry.
                intact = not cold and await backend.host_state(box) == HostState.SUSPENDED
                back = S.SUSPENDED if intact else S.FAILED
                self.store.transition(info.id, back, "resume rolled back", error=f"resume failed: {exc}")
                raise
            self._channels[info.id] = channel
            elapsed = time.monotonic() - started
            faults.point("resume.before_outcome")
            info = self.store.transition(
                info.id, S.RUNNING, f"{elapsed:.3f}s", last_resume_seconds=elapsed, backend_state=backend_state
            )
            await self._watch(info)
            await self._ready(info, channel)
            self.activity.touch(info.id)
            self.metrics.resume_seconds.observe(elapsed)
            log.info("resumed %s in %.3fs", info.id, elapsed)
            return self.present(info)

    async def terminate(self, ref: str, *, only_if_idle: bool = False, pooled: bool = False) -> SandboxInfo:
        """Remove the sandbox and its files. It always works: an operation stuck on it (a runsc call
        that hangs) is waited for ``FORCE_AFTER`` seconds, then the removal goes ahead without it."""
        info = self.lookup(ref, pooled=pooled)
        async with self._lock_or_force(info.id, wait=not only_if_idle):
            info = self.store.get(info.id)
            if info.status == S.TERMINATED:
                return self.present(info)
            if only_if_idle and (info.status != S.RUNNING or not self.activity.is_idle(info)):
                return self.present(info)
            info = await self._teardown(info)
        log.info("terminated %s%s", info.id, " (idle)" if only_if_idle else "")
        return self.present(info)

    async def leave(self, info: SandboxInfo, moved_to: str) -> SandboxInfo:
        """The remote store owns the sandbox now: remove this node's copy, recording where it went (a
        restart finishes this if cut off). The caller holds the sandbox's lock, or runs before serving."""
        if info.status == S.TERMINATED:
            return info
        return await self._teardown(info, moved_to=moved_to)

    async def _teardown(self, info: SandboxInfo, moved_to: str | None = None) -> SandboxInfo:
        """The one way a sandbox ends here: intent, its channel, its host side, what features hold of it,
        its network, outcome."""
        reason = f"moved to {moved_to}" if moved_to else None
        if info.status != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        faults.point("terminate.after_intent")
        self.watchdog.forget(info.id)
        await self.drop_channel(info.id)
        faults.point("terminate.after_close")
        await self.backend_of(info).stop(self.boxes.box_or_bare(info), remove=True)
        for hook in self.teardown_hooks:
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
            with contextlib.suppress(Exception):
                await backend.stop(box)

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

    async def adopt(self, info: SandboxInfo, box: BoxRef, detail: str) -> None:
        """Take over a sandbox found running (after a daemon restart)."""
        await self.attach_network(info)
        await self.adopt_channel(info, await self.backend_of(info).connect(box), detail)

    async def attach_network(self, info: SandboxInfo) -> None:
        """Its namespaces, firewall and the daemon's sockets in them, before its kernel boots (or after a
        daemon restart, for one that runs); nothing for a sandbox without network."""
        if info.spec.network is not None:
            await self.network.attach(info.id, info.spec.network, self.backend_of(info).network_device)

    async def adopt_channel(self, info: SandboxInfo, channel: GuestChannel, detail: str) -> None:
        self._channels[info.id] = channel
        self.activity.touch(info.id)  # a restarted daemon gives every sandbox a full idle window
        if info.status != S.RUNNING:
            self.store.transition(info.id, S.RUNNING, detail)
        await self._watch(info)

    # ------------------------------------------------------------ the guest

    async def channel(self, info: SandboxInfo) -> GuestChannel:
        channel = self._channels.get(info.id)
        if channel is None or channel.closed:
            channel = await self.backend_of(info).connect(self.boxes.box(info))
            self._channels[info.id] = channel
        return channel

    @contextlib.asynccontextmanager
    async def guest(self, ref: str, *, pooled: bool = False) -> AsyncIterator[GuestChannel]:
        """The channel of the sandbox, resumed first if it was suspended.

        While the block runs the sandbox counts as in use, so the idle reaper leaves it alone.
        """
        info = self.lookup(ref, pooled=pooled)
        with self.activity.busy(info.id):
            info = await self.ensure_running(info)
            channel = await self.channel(info)
            try:
                yield channel
            except GuestDisconnected:
                await self._check_alive(info)
                raise

    async def ensure_running(self, info: SandboxInfo) -> SandboxInfo:
        """Auto-resume. Concurrent callers queue on the sandbox's lock and share one resume."""
        if info.status == S.RUNNING:
            return info
        if info.status in (S.PENDING, S.SNAPSHOTTING):  # brief: wait for the operation, then go on
            async with self.lock(info.id):
                info = self.store.get(info.id)
        if info.status in (S.SUSPENDED, S.SUSPENDING, S.RESUMING):
            resumed = await self.resume(info.id)
            if resumed.status == S.RUNNING:
                self.metrics.auto_resumes.inc()
                return resumed
            info = resumed
        require(info, S.RUNNING)
        return info

    async def _check_alive(self, info: SandboxInfo) -> None:
        """After a lost connection: if the sandbox died, say why (a StateError) instead of "disconnected"."""
        await self.died(info.id)
        current = self.store.get(info.id)
        if current.status == S.FAILED:
            raise StateError(f"sandbox {current.name or current.id!r} failed: {current.error}", status="failed")
