"""The lifecycle core: owns every sandbox's locks, store transitions, channels and backend, and one
teardown. Nothing of pools, templates, exposed ports, the remote store or any face (HTTP, MCP, the
console) is here: they sit above it, and a create gets where the sandbox comes from as a value
(:mod:`.sources`) from them.

Lifecycle operations on one sandbox (create, suspend, resume, terminate, checkpoint) are serialised
by a per-sandbox lock; different sandboxes proceed in parallel. Commands and file operations
(:mod:`..rooms.operations`) run concurrently on a running sandbox, inside :meth:`SandboxService.guest`.

Each lifecycle operation writes its intent to the store before touching the host and its outcome
after (:mod:`.operation`, :mod:`.lifecycle`), so :mod:`.recovery` can finish or roll back whatever a
killed daemon left half-done. The rooms above get verbs, never the store, the boxes or the network: the
sandbox table has one writer, this floor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from ...backends import BACKENDS, create_backend
from ...backends.base import Backend
from ...errors import GuestDisconnected, StasisError, StateError, Unsupported
from ...guest.client import GuestChannel
from ...images import ImageStore
from ...models import CreateSandboxRequest, SandboxInfo, SandboxSpec, SandboxStatus
from ...netpolicy import NetworkPolicy
from ...network.audit import EgressAudit
from ...network.engine import NetworkEngine
from ...paths import Paths
from . import events
from .activity import Activity, Clock
from .boxes import Boxes
from .checkpoints import CheckpointFiles
from .lifecycle import ID_ALPHABET, Lifecycle, ReadyHook, StoppingHook, TeardownHook, new_id
from .metrics import Metrics
from .states import require
from .store import Store
from .tables import Tables
from .watchdog import Watchdog

log = logging.getLogger(__name__)

S = SandboxStatus
__all__ = ["ID_ALPHABET", "SandboxService", "new_id"]


class SandboxService(Lifecycle):
    def __init__(self, paths: Paths, backends: dict[str, Backend] | None = None, clock: Clock = time.time) -> None:
        """``backends`` replaces the registry's (a test's fake); otherwise every registered one is tried.
        ``clock`` is the wall clock idle times are read from (the fast tests' own)."""
        self.paths = paths
        self.store = Store(paths.database)
        self.tables: Tables = self.store.tables  # the rooms' own tables: handed to their owners by the wiring
        self.images = ImageStore(paths.images)
        self.checkpoint_files = CheckpointFiles(paths.home / "checkpoints")
        self.backends = dict(backends or {})
        self._given_backends = backends is not None
        self.unavailable = {}  # backend -> why it does not work here
        self.activity = Activity(clock)
        self.metrics = Metrics()
        self.network = NetworkEngine(paths.runtime.name, self.activity.touch, EgressAudit(paths.sandboxes.joinpath))
        self.boxes = Boxes(paths, self.images, self.network)
        self.watchdog = Watchdog(self.died)
        self._teardown_hooks = []  # what features above hold of a sandbox (its exposed ports' listeners) goes with it
        self._admit = lambda spec, sandbox_id: None
        self._lifetime_cap = lambda team: None
        self._stopping_hooks = []  # what reads a sandbox's host processes before they stop (the meter)
        self._ready_hooks = []  # what features above put into a sandbox each time it starts here (its secrets' CA)
        self._channels = {}
        self._locks = {}
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

    def on_ready(self, hook: ReadyHook) -> None:
        """``hook`` runs each time a sandbox starts or resumes here (a room putting its CA into it)."""
        self._ready_hooks.append(hook)

    def on_teardown(self, hook: TeardownHook) -> None:
        """``hook`` runs when a sandbox ends here (a room letting go of its listeners)."""
        self._teardown_hooks.append(hook)

    def on_stopping(self, hook: StoppingHook) -> None:
        """``hook`` runs (in a worker thread) just before a sandbox's host processes stop: suspend, removal, death."""
        self._stopping_hooks.append(hook)

    def use_quotas(
        self, admit: Callable[[SandboxSpec, str | None], None], lifetime_cap: Callable[[str | None], int | None]
    ) -> None:
        """``admit`` runs before a sandbox starts (created or resumed) and raises to refuse it; ``lifetime_cap``
        says a team's longest lifetime (a team's quotas)."""
        self._admit, self._lifetime_cap = admit, lifetime_cap

    def use_secrets(self, broker: Any) -> None:
        """The broker the egress proxy asks to put secrets into a sandbox's HTTPS requests."""
        self.network.secrets = broker

    # ------------------------------------------------------------ reading

    def get(self, ref: str) -> SandboxInfo:
        return self.present(self.lookup(ref))

    def record(self, sandbox_id: str) -> SandboxInfo:
        """The stored record by id (or live name), pool members and removed ones too, as stored."""
        return self.store.get(sandbox_id)

    def list(
        self, include_terminated: bool = False, limit: int | None = None, after: tuple[float, str] | None = None
    ) -> list[SandboxInfo]:
        infos = self.store.list(include_terminated, include_pooled=False, limit=limit, after=after)
        return [self.present(info) for info in infos]

    def events_after(self, seq: int, limit: int = 500) -> list[dict[str, Any]]:
        """Lifecycle events past ``seq`` (the outbox :mod:`.events` describes), oldest first."""
        return events.after(self.store.db, seq, limit)

    def last_event(self) -> int:
        return events.last(self.store.db)

    def events_of(
        self, sandbox_id: str | None = None, team: str | None = None, types: list[str] | None = None,
        offset: int = 0, limit: int = 100, ascending: bool = False,
    ) -> list[dict[str, Any]]:  # fmt: skip
        return events.page(self.store.db, sandbox_id, team, types or [], offset, limit, ascending)

    def records(self, *, include_terminated: bool = False, status: SandboxStatus | None = None) -> list[SandboxInfo]:
        """Every stored record, pool members too, oldest first (``status``: only those in it)."""
        return self.store.list(include_terminated, status=status)

    def journal(self, sandbox_id: str) -> list[dict[str, Any]]:
        """Its transitions, oldest first: every intent and outcome."""
        return self.store.transitions(sandbox_id)

    def pool_members(self, pool: str | None = None) -> list[SandboxInfo]:
        return self.store.pool_members(pool)

    def persist_activity(self) -> None:
        self.activity.persist(self.store)

    # ------------------------------------------------------------ what a room may know of the host

    def files_of(self, info: SandboxInfo) -> Path:
        """The sandbox's directory on this host (its files while suspended)."""
        return self.boxes.box_or_bare(info).directory

    def home_for(self, sandbox_id: str) -> Path:
        """Where a sandbox of this id keeps its files here (validated: an id from outside names only ours)."""
        return self.boxes.directory(sandbox_id)

    def python_argv(self, info: SandboxInfo) -> list[str]:
        return self.boxes.python_argv(info)

    def command_defaults(self, info: SandboxInfo) -> tuple[dict[str, str], str | None, str | None]:
        return self.boxes.command_defaults(info)

    @property
    def egress_audit(self) -> EgressAudit | None:
        return self.network.audit

    def traffic(self, sandbox_id: str) -> tuple[str, int, int] | None:
        """Bytes out and back through the sandbox's egress proxy so far, with the proxy's run (None: no network)."""
        return self.network.traffic(sandbox_id)

    async def connect_port(self, sandbox_id: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to ``port`` inside a sandbox with network, from the daemon's side."""
        return await self.network.connect(sandbox_id, port)

    # ------------------------------------------------------------ changes that are not operations

    def claim(self, pool: str, image_key: str, request: CreateSandboxRequest) -> SandboxInfo | None:
        """The oldest ready member of ``pool`` on ``image_key``, handed to ``request`` (its name, idle policy)
        in one transaction; None if none is ready."""
        info = self.store.claim_member(pool, image_key, request)
        if info is not None and (request.lifetime_secs is not None or info.deadline is not None):
            deadline = None if request.lifetime_secs is None else self.activity.clock() + request.lifetime_secs
            info = self.store.set_deadline(info.id, deadline, "the claim's lifetime")
        return info

    def arrived(self, info: SandboxInfo, detail: str) -> SandboxInfo:
        """A suspended sandbox whose files were just put in :meth:`home_for` (pulled from the remote store)."""
        return self.store.arrive(info, detail)

    async def set_network(self, ref: str, policy: NetworkPolicy) -> SandboxInfo:
        """A new egress policy, live: the next connection is judged by it."""
        async with self.locked(ref) as info:
            if info.spec.network is None:
                raise Unsupported(
                    f"sandbox {info.name or info.id!r} was created without network, so its kernel has no network "
                    "device; create it with network=NetworkPolicy(...) (or `stasis create --network`) instead"
                )
            info = self.store.update_spec(info.id, info.spec.model_copy(update={"network": policy}),
                                          f"network: {policy.describe()}")  # fmt: skip
            await self.network.update(info.id, policy)
            return self.present(info)

    async def set_lifetime(
        self, ref: str, seconds: float, *, extend_only: bool = False, on_end: str | None = None
    ) -> SandboxInfo:
        """Its lifetime runs ``seconds`` from now (and from each later resume), then its idle action runs, used
        or not; ``extend_only`` only moves a deadline it has later (its lifetime stays); ``on_end`` (suspend or
        terminate) replaces its idle policy: no idle window, that action at the deadline."""
        async with self.locked(ref) as info:
            require(info, info.status if info.status in (S.RUNNING, S.SUSPENDED) else S.RUNNING)
            if (cap := self._lifetime_cap(info.spec.team)) is not None:
                seconds = min(seconds, cap)  # its team's quota: never longer
            deadline = self.activity.clock() + seconds
            if extend_only and info.deadline is not None:
                deadline = max(deadline, info.deadline)
            change: dict[str, Any] = {} if extend_only else {"lifetime_secs": max(0, round(seconds))}
            if on_end is not None:
                change |= {"on_idle": on_end, "timeout_secs": None}
            if any(getattr(info.spec, k) != v for k, v in change.items()):
                info = self.store.update_spec(info.id, info.spec.model_copy(update=change),
                                              f"lifetime: {change}")  # fmt: skip
            if deadline != info.deadline:
                left = deadline - self.activity.clock()
                info = self.store.set_deadline(info.id, deadline, f"deadline in {left:.0f} s")
            return self.present(info)

    # ------------------------------------------------------------ the guest

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
