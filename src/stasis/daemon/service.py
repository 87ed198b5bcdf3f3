"""The sandbox service: owns every sandbox, drives its backend, keeps the store true.

Lifecycle operations on one sandbox (create, suspend, resume, terminate, checkpoint)
are serialised by a per-sandbox lock; different sandboxes proceed in parallel.
Commands and file operations (:mod:`.operations`) run concurrently on a running
sandbox, inside :meth:`SandboxService.guest`.

Each lifecycle operation writes its intent to the store before touching the host
and its outcome after, so :mod:`.recovery` can finish or roll back whatever a
killed daemon left half-done. Recovery, the idle reaper (:mod:`.idle`) and forks
(:mod:`.forks`) are wired beside this class in the app's lifespan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .. import faults, hostpath
from ..backends import BACKENDS, create_backend
from ..backends.base import Backend, BoxRef, HostState
from ..errors import (
    GuestDisconnected,
    NotFound,
    SandboxNotFound,
    StasisError,
    StateError,
    Unsupported,
)
from ..fsutil import no_space
from ..guest.client import GuestChannel
from ..images import ImageStore, runtime
from ..images.oci import ImageConfig
from ..models import (
    CheckpointInfo,
    CheckpointType,
    CreateCheckpointRequest,
    CreateSandboxRequest,
    SandboxInfo,
    SandboxSpec,
    SandboxStatus,
)
from ..netpolicy import NetworkPolicy
from ..network.engine import NetworkEngine
from ..paths import Paths
from ..remote.config import RemoteConfig
from .activity import Activity, idle_action
from .checkpoints import CheckpointFiles
from .metrics import Metrics
from .pools import PoolManager
from .ports import Ports
from .remote import RemoteService
from .states import require
from .store import Store
from .templates import template_checkpoint
from .usage import spec_from_checkpoint
from .watchdog import Watchdog

log = logging.getLogger(__name__)

S = SandboxStatus
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
FORCE_AFTER = 10.0  # seconds a removal waits for another operation on the sandbox


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


class SandboxService:
    def __init__(self, paths: Paths, backends: dict[str, Backend] | None = None) -> None:
        """``backends`` replaces the registry's (a test's fake); otherwise every registered one is tried."""
        self.paths = paths
        self.store = Store(paths.database)
        self.images = ImageStore(paths.images)
        self.checkpoint_files = CheckpointFiles(paths.home / "checkpoints")
        self.backends: dict[str, Backend] = dict(backends or {})
        self._given_backends = backends is not None
        self.unavailable: dict[str, str] = {}  # backend -> why it does not work here
        self.activity = Activity()
        self.metrics = Metrics()
        self._channels: dict[str, GuestChannel] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.watchdog = Watchdog(self)
        self.network = NetworkEngine(paths.runtime.name, self.activity.touch)
        self.ports = Ports(self)
        self._image_configs: dict[str, ImageConfig | None] = {}
        self.pools = PoolManager(self)
        remote = RemoteConfig.from_env()
        self.remote = RemoteService(self, remote) if remote else None

    # ------------------------------------------------------------ start-up and shutdown

    async def start(self) -> None:
        names = list(self.backends) if self._given_backends else list(BACKENDS)
        for name in names:
            try:
                backend = self.backends.get(name) or create_backend(name, self.paths)
                await backend.initialize()
            except StasisError as exc:  # a host without QEMU still serves gVisor sandboxes, and vice versa
                log.warning("backend %s is unavailable: %s", name, exc)
                self.unavailable[name] = str(exc)
                self.backends.pop(name, None)
                continue
            self.backends[name] = backend
        if not self.backends:
            raise StasisError(f"no backend works on this host: {self.unavailable}")
        await self.ports.start()

    async def close(self) -> None:
        """Stop serving. Sandboxes keep running; the next daemon re-adopts them."""
        await self.pools.close()
        self.activity.persist(self.store)
        self.watchdog.close()
        await self.ports.close()
        self.network.close()
        for channel in list(self._channels.values()):
            await channel.close()
        self._channels.clear()
        for backend in self.backends.values():
            await backend.close()
        self.store.close()

    def describe_backends(self) -> dict[str, dict[str, Any]]:
        described = {name: backend.describe() for name, backend in self.backends.items()}
        return described | {name: {"backend": name, "unavailable": why} for name, why in self.unavailable.items()}

    # ------------------------------------------------------------ reading

    def get(self, ref: str) -> SandboxInfo:
        return self._present(self.lookup(ref))

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
        return [self._present(info) for info in infos]

    def _present(self, info: SandboxInfo) -> SandboxInfo:
        """The stored record with what only memory knows: last use, the idle deadline, the backend's view."""
        last = self.activity.last(info)
        update: dict[str, Any] = {"last_activity": last}
        if info.status == S.RUNNING and info.spec.timeout_secs is not None:
            update["idle_action"] = idle_action(info)
            update["idle_action_at"] = last + info.spec.timeout_secs
        backend = self.backends.get(info.spec.backend)
        if backend is not None:
            with contextlib.suppress(ValueError):
                update["runtime"] = backend.describe_state(info.runtime)
        return info.model_copy(update=update)

    # ------------------------------------------------------------ helpers

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        """Serialises lifecycle operations on one sandbox."""
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    async def drop_channel(self, sandbox_id: str) -> None:
        channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            await channel.close()

    def backend_of(self, info: SandboxInfo) -> Backend:
        backend = self.backends.get(info.spec.backend)
        if backend is None:
            why = self.unavailable.get(info.spec.backend, "unknown backend")
            raise Unsupported(f"backend {info.spec.backend!r} is not available on this host: {why}")
        return backend

    def _box(self, info: SandboxInfo, image_rootfs: Path | None = None) -> BoxRef:
        key = info.image_key or self.images.get(info.spec.image).key
        return BoxRef(
            id=info.id,
            hostname=info.name or info.id,
            spec=info.spec,
            directory=hostpath.child(self.paths.sandboxes, info.id, "sandbox id", hostpath.SANDBOX_ID),
            image_key=key,
            image_rootfs=image_rootfs or self.images.rootfs_by_key(key),
            state=info.runtime,
            network=self.network.net(info.id) if info.spec.network else None,
            python=self.images.by_key(key).python if image_rootfs is None else "/usr/bin/python3",
        )

    def box_or_bare(self, info: SandboxInfo) -> BoxRef:
        """A BoxRef even if the image is gone: stopping and destroying must always work."""
        try:
            return self._box(info)
        except StasisError:
            return self._box(info.model_copy(update={"image_key": info.image_key or "gone"}), Path("/"))

    # ------------------------------------------------------------ lifecycle

    async def create(
        self,
        request: CreateSandboxRequest,
        *,
        verify: bool = True,
        pool: str | None = None,
        forked_from: str | None = None,
    ) -> SandboxInfo:
        """A new sandbox: claimed from a warm pool of its spec if one has a member ready, else started;
        ``pool`` makes it a waiting member of that pool instead; ``forked_from`` names a fork's parent."""
        if pool is None and forked_from is None and (claimed := await self.pools.claim(request)) is not None:
            self.metrics.pool_claims.inc()
            return self._present(claimed)
        checkpoint = None
        if request.template is not None and request.snapshot_id is None:
            request = request.model_copy(update={"snapshot_id": template_checkpoint(self, request.template)})
        if request.snapshot_id is not None:
            checkpoint = await self._checkpoint_here_or_pulled(request.snapshot_id)
            spec = spec_from_checkpoint(checkpoint, request)
        else:
            spec = SandboxSpec.model_validate(request.model_dump(exclude={"name", "snapshot_id", "template"}))
        if spec.backend not in self.backends:
            why = self.unavailable.get(spec.backend, "unknown backend")
            raise Unsupported(f"backend {spec.backend!r} is not available on this host: {why}")
        # Refuse before anything exists on the host; pin the exact image build.
        image_key = checkpoint.image if checkpoint else self.images.get(spec.image).key
        self.images.rootfs_by_key(image_key)
        if checkpoint is not None and verify:
            await asyncio.to_thread(self.checkpoint_files.verify, checkpoint.id, checkpoint.sha256)
        from_checkpoint = checkpoint.id if checkpoint else None
        info = self.store.insert(new_id("sb-"), request.name, spec, image_key, from_checkpoint, pool, forked_from)
        backend = self.backends[spec.backend]
        async with self.lock(info.id):
            box = self._box(info)
            faults.point("create.after_intent")
            started = time.monotonic()
            try:
                await self.attach_network(info)
                if checkpoint is None:
                    channel, state = await backend.start(box)
                else:
                    source = self.checkpoint_files.path(checkpoint.id)
                    memory = checkpoint.type == CheckpointType.MEMORY
                    channel, state = await backend.start_from(box, source, memory, checkpoint.runtime)
            except BaseException as exc:
                await self.discard(info, box, f"start failed: {exc}")
                raise
            self._channels[info.id] = channel
            faults.point("create.before_outcome")
            detail = f"from checkpoint {checkpoint.id}" if checkpoint else "started"
            info = self.store.transition(info.id, S.RUNNING, detail, backend_state=state.model_dump(mode="json"))
            await self.watchdog.watch(info.id)
            self.activity.touch(info.id)
            self.metrics.create_seconds.observe(time.monotonic() - started)
            log.info("created %s (%s) in %.3fs", info.id, info.name, time.monotonic() - started)
            return self._present(info)

    async def _checkpoint_here_or_pulled(self, ref: str) -> CheckpointInfo:
        try:
            return self.store.get_checkpoint(ref)
        except NotFound:
            if self.remote is None:
                raise
            await self.remote.pull_checkpoint(ref)
            return self.store.get_checkpoint(ref)

    async def discard(self, info: SandboxInfo, box: BoxRef, reason: str) -> None:
        """Roll back a create: nothing stays on the host, the record says why."""
        with contextlib.suppress(Exception):
            await self.backend_of(info).destroy(box)
        with contextlib.suppress(Exception):
            await self.network.detach(info.id)
        if self.store.get(info.id).status != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        self.store.transition(info.id, S.TERMINATED, reason, error=reason)

    async def checkpoint(self, ref: str, request: CreateCheckpointRequest, *, internal: bool = False) -> CheckpointInfo:
        """Capture the sandbox (paused briefly) as an immutable artifact; it keeps running."""
        info = await self.ensure_running(self.lookup(ref))
        async with self.lock(info.id):
            info = self.store.get(info.id)
            require(info, S.RUNNING)
            backend, box = self.backend_of(info), self._box(info)
            channel = await self._channel(info)
            now = time.time()
            checkpoint = CheckpointInfo(
                id=new_id("ck-"), name=request.name, type=request.type, sandbox_id=info.id, sandbox_name=info.name,
                image=box.image_key, spec=info.spec, backend=info.spec.backend, runtime=info.runtime,
                created_at=now, expires_at=now + request.ttl_secs if request.ttl_secs else None, sha256=None,
                size_bytes=0, metadata=request.metadata,
            )  # fmt: skip
            self.store.insert_checkpoint(checkpoint, internal=internal)  # intent: 'writing'
            self.store.transition(info.id, S.SNAPSHOTTING, f"{request.type.value} checkpoint {checkpoint.id}")
            faults.point("checkpoint.after_intent")
            started = time.monotonic()
            try:
                partial = self.checkpoint_files.begin(checkpoint.id)
                await backend.checkpoint(box, channel, partial, request.type == CheckpointType.MEMORY)
                faults.point("checkpoint.before_seal")
                sha256, size = await asyncio.to_thread(self.checkpoint_files.seal, checkpoint.id, not internal)
                faults.point("checkpoint.after_seal")
                checkpoint = checkpoint.model_copy(update={"sha256": sha256, "size_bytes": size})
                self.store.seal_checkpoint(checkpoint)  # outcome: 'ready'
            except BaseException as exc:
                self.checkpoint_files.remove(checkpoint.id)
                self.store.delete_checkpoint(checkpoint.id)
                alive = await backend.host_state(box) == HostState.RUNNING
                target = S.RUNNING if alive else S.FAILED
                self.store.transition(info.id, target, "checkpoint rolled back", error=f"checkpoint failed: {exc}")
                if (full := no_space(exc, self.checkpoint_files.root)) is not exc:
                    raise full from exc  # a full disk midway is the same 507 as the check before it
                raise
            faults.point("checkpoint.before_outcome")
            self.store.transition(info.id, S.RUNNING, f"checkpoint {checkpoint.id} ready")
            elapsed = time.monotonic() - started
            self.metrics.checkpoint_seconds.observe(elapsed)
            log.info("checkpoint %s (%s) of %s in %.3fs, %d bytes", checkpoint.id, request.type.value, info.id,
                     elapsed, size)  # fmt: skip
            return checkpoint

    async def suspend(self, ref: str, *, only_if_idle: bool = False) -> SandboxInfo:
        info = self.lookup(ref)
        async with self.lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.SUSPENDED:
                return self._present(info)
            require(info, S.RUNNING)
            backend, box = self.backend_of(info), self._box(info)
            channel = await self._channel(info)
            if only_if_idle and not self.activity.is_idle(info):
                return self._present(info)  # used since the reaper looked: no await between this and the intent
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
            return self._present(info)

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
            await self.watchdog.watch(info.id)
        else:
            await backend.stop(box)
            self.store.transition(info.id, S.FAILED, error=f"suspend failed and the sandbox stopped: {exc}")

    async def resume(self, ref: str) -> SandboxInfo:
        info = await self._here_or_pulled(ref)
        async with self.lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.RUNNING:
                return self._present(info)
            backend, box = self.backend_of(info), self._box(info)
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
            await self.watchdog.watch(info.id)
            self.activity.touch(info.id)
            self.metrics.resume_seconds.observe(elapsed)
            log.info("resumed %s in %.3fs", info.id, elapsed)
            return self._present(info)

    async def _here_or_pulled(self, ref: str) -> SandboxInfo:
        """The sandbox to resume: this node's, or (a remote store configured) taken over from the store;
        one that moved to another node is refused, naming that node."""
        try:
            info = self.lookup(ref)
        except SandboxNotFound:
            if self.remote is None:
                raise
            await self.remote.pull_sandbox(ref)
            return self.lookup(ref)
        if info.status == S.TERMINATED and (info.error or "").startswith("moved to") and self.remote is not None:
            await self.remote.pull_sandbox(info.id)  # it left this node: back only if the store has it
            return self.store.get(info.id)
        if self.remote is not None and self.remote.unsettled(info.id):
            raise StateError(
                f"sandbox {info.name or info.id} was being pushed when the daemon stopped, and the remote store could "
                "not be reached since to learn whether it took it; `stasis push` it again once the store is reachable"
            )
        return info

    async def terminate(self, ref: str, *, only_if_idle: bool = False, pooled: bool = False) -> SandboxInfo:
        """Remove the sandbox and its files. It always works: an operation stuck on it (a runsc call
        that hangs) is waited for ``FORCE_AFTER`` seconds, then the removal goes ahead without it."""
        info = self.lookup(ref, pooled=pooled)
        async with self._lock_or_force(info.id, wait=not only_if_idle):
            info = self.store.get(info.id)
            if info.status == S.TERMINATED:
                return self._present(info)
            if only_if_idle and (info.status != S.RUNNING or not self.activity.is_idle(info)):
                return self._present(info)
            if info.status != S.TERMINATING:
                self.store.transition(info.id, S.TERMINATING)
            faults.point("terminate.after_intent")
            self.watchdog.forget(info.id)
            await self.drop_channel(info.id)
            faults.point("terminate.after_close")
            await self.backend_of(info).destroy(self.box_or_bare(info))
            await self.ports.forget(info.id)
            await self.network.detach(info.id)
            faults.point("terminate.before_outcome")
            info = self.store.transition(info.id, S.TERMINATED)
        self._locks.pop(info.id, None)
        self.activity.forget(info.id)
        log.info("terminated %s%s", info.id, " (idle)" if only_if_idle else "")
        return self._present(info)

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

    def python_argv(self, ref: str) -> list[str]:
        """How to start python3 in the sandbox: the image's, or stasis's own (an image without one)."""
        info = self.lookup(ref)
        try:
            python = self.images.by_key(info.image_key or "").python
        except StasisError:
            python = "/usr/bin/python3"
        return [python] if python else runtime.argv_prefix()

    def command_defaults(self, ref: str) -> tuple[dict[str, str], str | None, str | None]:
        """The env, working directory and user its image asks commands to run with (an imported image's
        Env, WorkingDir and User); nothing for a built-in recipe's."""
        info = self.lookup(ref)
        key = info.image_key or ""
        if key not in self._image_configs:
            try:
                self._image_configs[key] = self.images.by_key(key).config
            except StasisError:
                self._image_configs[key] = None
        config = self._image_configs[key]
        return (config.env, config.working_dir, config.user) if config else ({}, None, None)

    async def attach_network(self, info: SandboxInfo) -> None:
        """Its namespaces, firewall and the daemon's sockets in them, before its kernel boots (or after a
        daemon restart, for one that runs); nothing for a sandbox without network."""
        if info.spec.network is not None:
            await self.network.attach(info.id, info.spec.network, self.backend_of(info).network_device)

    async def update_network(self, ref: str, policy: NetworkPolicy) -> SandboxInfo:
        """A new egress policy, live: the next connection is judged by it."""
        info = self.lookup(ref)
        async with self.lock(info.id):
            info = self.store.get(info.id)
            if info.spec.network is None:
                raise Unsupported(
                    f"sandbox {info.name or info.id!r} was created without network, so its kernel has no network "
                    "device; create it with network=NetworkPolicy(...) (or `stasis create --network`) instead"
                )
            info = self.store.update_spec(info.id, info.spec.model_copy(update={"network": policy}),
                                          f"network: {policy.describe()}")  # fmt: skip
            await self.network.update(info.id, policy)
            return self._present(info)

    async def adopt_channel(self, info: SandboxInfo, channel: GuestChannel, detail: str) -> None:
        self._channels[info.id] = channel
        self.activity.touch(info.id)  # a restarted daemon gives every sandbox a full idle window
        if info.status != S.RUNNING:
            self.store.transition(info.id, S.RUNNING, detail)
        await self.watchdog.watch(info.id)

    # ------------------------------------------------------------ the guest

    async def _channel(self, info: SandboxInfo) -> GuestChannel:
        channel = self._channels.get(info.id)
        if channel is None or channel.closed:
            channel = await self.backend_of(info).connect(self._box(info))
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
            channel = await self._channel(info)
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
        await self.watchdog.died(info.id)
        current = self.store.get(info.id)
        if current.status == S.FAILED:
            raise StateError(f"sandbox {current.name or current.id!r} failed: {current.error}", status="failed")

    # ------------------------------------------------------------ checkpoints and disk

    def delete_checkpoint(self, ref: str) -> CheckpointInfo:
        checkpoint = self.store.get_checkpoint(ref)
        self.store.delete_checkpoint(checkpoint.id)  # the record first: a crash leaves a directory the sweep removes
        self.checkpoint_files.remove(checkpoint.id)
        log.info("deleted checkpoint %s", checkpoint.id)
        return checkpoint

    def expire_checkpoints(self) -> None:
        now = time.time()
        for checkpoint in self.store.list_checkpoints():
            if checkpoint.expires_at is not None and checkpoint.expires_at <= now:
                log.warning("checkpoint %s (%s) reached its TTL: deleting it", checkpoint.id, checkpoint.name)
                self.delete_checkpoint(checkpoint.id)
