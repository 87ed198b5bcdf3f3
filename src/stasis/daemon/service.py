"""The sandbox service: owns every sandbox, drives the backend, keeps the store true.

Lifecycle operations on one sandbox (create, suspend, resume, terminate) are
serialised by a per-sandbox lock; different sandboxes proceed in parallel.
Commands and file operations run concurrently on a running sandbox.

Each lifecycle operation writes its intent to the store before touching the host
and its outcome after, so :meth:`recover` can finish or roll back whatever a
killed daemon left half-done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .. import faults
from ..backends import BACKENDS, Backend, BoxRef, HostState, create_backend
from ..errors import (
    GuestDisconnected,
    InvalidRequest,
    StasisError,
    StateError,
)
from ..fsutil import tree_bytes
from ..guest.channel import GuestChannel
from ..images import ImageStore
from ..models import (
    CheckpointInfo,
    CheckpointType,
    CreateCheckpointRequest,
    CreateSandboxRequest,
    DiskUsage,
    SandboxInfo,
    SandboxSpec,
    SandboxStatus,
)
from ..paths import Paths
from .checkpoints import CheckpointFiles
from .metrics import Metrics
from .operations import GuestOperations
from .states import WHY_NOT
from .store import Store

log = logging.getLogger(__name__)

S = SandboxStatus
ID_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


IDLE_TICK = 0.5  # seconds between looks for idle sandboxes


def idle_action(info: SandboxInfo) -> str:
    """Named sandboxes are kept (suspended); unnamed ones are disposable (terminated)."""
    return info.spec.on_idle or ("suspend" if info.name else "terminate")


def new_sandbox_id() -> str:
    return "sb-" + "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


def new_checkpoint_id() -> str:
    return "ck-" + "".join(secrets.choice(ID_ALPHABET) for _ in range(12))


class SandboxService(GuestOperations):
    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.store = Store(paths.database)
        self.images = ImageStore(paths.images)
        self.checkpoint_files = CheckpointFiles(paths.home / "checkpoints")
        self.backends: dict[str, Backend] = {}
        self.unavailable: dict[str, str] = {}  # backend -> why it does not work here
        self._channels: dict[str, GuestChannel] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._activity: dict[str, float] = {}  # last use, in memory: a write per exec would cost an fsync
        self._inflight: dict[str, int] = {}  # operations under way: a sandbox in use is never idle
        self._idle_task: asyncio.Task[None] | None = None
        self._idle_busy: set[str] = set()
        self.metrics = Metrics()

    # ------------------------------------------------------------ start-up and shutdown

    async def start(self) -> None:
        for name in BACKENDS:
            try:
                backend = create_backend(name, self.paths)
                await backend.initialize()
            except StasisError as exc:  # a host without QEMU still serves gVisor sandboxes, and vice versa
                log.warning("backend %s is unavailable: %s", name, exc)
                self.unavailable[name] = str(exc)
                continue
            self.backends[backend.name] = backend
        if not self.backends:
            raise StasisError(f"no backend works on this host: {self.unavailable}")
        await self.recover()
        self._idle_task = asyncio.get_running_loop().create_task(self._idle_loop())

    async def close(self) -> None:
        """Stop serving. Sandboxes keep running; the next daemon re-adopts them."""
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
        self._persist_activity()
        for channel in list(self._channels.values()):
            await channel.close()
        self._channels.clear()
        self.store.close()

    def describe_backends(self) -> dict[str, dict[str, Any]]:
        described = {name: backend.describe() for name, backend in self.backends.items()}
        return described | {name: {"backend": name, "unavailable": why} for name, why in self.unavailable.items()}

    # ------------------------------------------------------------ helpers

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def _box(self, info: SandboxInfo) -> BoxRef:
        return BoxRef(
            id=info.id,
            hostname=info.name or info.id,
            spec=info.spec,
            directory=self.paths.sandboxes / info.id,
            image_rootfs=self._image_rootfs(info),
            backend_state=info.backend,
        )

    def _image_rootfs(self, info: SandboxInfo) -> Path:
        key = info.backend.get("image_key")
        return self.images.rootfs_by_key(key) if key else self.images.rootfs(info.spec.image)

    def _backend(self, info: SandboxInfo) -> Backend:
        backend = self.backends.get(info.spec.backend)
        if backend is None:
            raise InvalidRequest(f"backend {info.spec.backend!r} is not available on this host")
        return backend

    def _with_activity(self, info: SandboxInfo) -> SandboxInfo:
        last = self._activity.get(info.id) or info.last_activity
        update: dict[str, Any] = {"last_activity": last}
        if info.status == S.RUNNING and info.spec.timeout_secs is not None:
            update["idle_action"] = idle_action(info)
            update["idle_action_at"] = last + info.spec.timeout_secs
        return info.model_copy(update=update)

    def _persist_activity(self) -> None:
        for sandbox_id, last in self._activity.items():
            self.store.touch_at(sandbox_id, last)

    def get(self, ref: str) -> SandboxInfo:
        return self._with_activity(self.store.get(ref))

    def list(self, include_terminated: bool = False) -> list[SandboxInfo]:
        return [self._with_activity(info) for info in self.store.list(include_terminated)]

    # ------------------------------------------------------------ lifecycle

    async def create(self, request: CreateSandboxRequest, *, verify: bool = True) -> SandboxInfo:
        checkpoint = None
        if request.snapshot_id is not None:
            checkpoint = self.store.get_checkpoint(request.snapshot_id)
            spec_model = self._spec_from_checkpoint(checkpoint, request)
        else:
            spec_model = SandboxSpec.model_validate(request.model_dump(exclude={"name", "snapshot_id"}))
        backend = self.backends.get(spec_model.backend)
        if backend is None:
            why = self.unavailable.get(spec_model.backend, "unknown backend")
            raise InvalidRequest(f"backend {spec_model.backend!r} is not available on this host: {why}")
        if spec_model.network:
            raise InvalidRequest("network access inside sandboxes is not supported yet; leave network off")
        # Refuse before anything exists on the host; pin the exact image build.
        image_key = checkpoint.image if checkpoint else self.images.get(spec_model.image).key
        self.images.rootfs_by_key(image_key)
        if checkpoint is not None and verify:
            sha = checkpoint.sha256
            await asyncio.to_thread(self.checkpoint_files.verify, checkpoint.id, sha)
        info = self.store.insert(new_sandbox_id(), request.name, spec_model, {"image_key": image_key})
        async with self._lock(info.id):
            box = self._box(info)
            faults.point("create.after_intent")
            started = time.monotonic()
            try:
                if checkpoint is None:
                    channel, backend_state = await backend.start(box)
                else:
                    source = self.checkpoint_files.path(checkpoint.id)
                    memory = checkpoint.type == CheckpointType.MEMORY
                    channel, backend_state = await backend.start_from(box, source, memory, checkpoint.backend_state)
            except BaseException as exc:
                await self._discard(info, box, f"start failed: {exc}")
                raise
            self._channels[info.id] = channel
            faults.point("create.before_outcome")
            detail = f"from checkpoint {checkpoint.id}" if checkpoint else "started"
            backend_state = {**backend_state, "image_key": image_key}
            if checkpoint is not None:
                backend_state["from_checkpoint"] = checkpoint.id
            info = self.store.transition(info.id, S.RUNNING, detail, backend_state=backend_state)
            self._activity[info.id] = time.time()
            self.metrics.create_seconds.observe(time.monotonic() - started)
            log.info("created %s (%s) in %.3fs", info.id, info.name, time.monotonic() - started)
            return info

    def _spec_from_checkpoint(self, checkpoint: CheckpointInfo, request: CreateSandboxRequest) -> SandboxSpec:
        """The checkpoint's resources; a MEMORY restore must keep its memory size and backend."""
        if "backend" in request.model_fields_set and request.backend != checkpoint.backend:
            raise InvalidRequest(
                f"checkpoint {checkpoint.id} was made on backend {checkpoint.backend!r}, not {request.backend!r}"
            )
        overrides = {k: getattr(request, k) for k in request.model_fields_set & {"timeout_secs", "on_idle", "cpus"}}
        overrides["backend"] = checkpoint.backend
        if checkpoint.type == CheckpointType.FILESYSTEM:
            overrides |= {k: getattr(request, k) for k in request.model_fields_set & {"memory_mb"}}
        elif "memory_mb" in request.model_fields_set and request.memory_mb != checkpoint.spec.memory_mb:
            raise InvalidRequest(
                f"a MEMORY checkpoint restores with the memory it was taken with ({checkpoint.spec.memory_mb} MiB)"
            )
        return checkpoint.spec.model_copy(update=overrides)

    async def _discard(self, info: SandboxInfo, box: BoxRef, reason: str) -> None:
        """Roll back a create: nothing stays on the host, the record says why."""
        with contextlib.suppress(Exception):
            await self._backend(info).destroy(box)
        current = self.store.get(info.id).status
        if current != S.TERMINATING:
            self.store.transition(info.id, S.TERMINATING, reason)
        self.store.transition(info.id, S.TERMINATED, reason, error=reason)

    # ------------------------------------------------------------ checkpoints and forks

    async def checkpoint(self, ref: str, request: CreateCheckpointRequest, *, internal: bool = False) -> CheckpointInfo:
        """Capture the sandbox (paused briefly) as an immutable artifact; it keeps running."""
        info = await self._ensure_running(self.store.get(ref))
        async with self._lock(info.id):
            info = self.store.get(info.id)
            self._require(info, S.RUNNING)
            backend, box = self._backend(info), self._box(info)
            channel = await self._channel(info)
            now = time.time()
            checkpoint = CheckpointInfo(
                id=new_checkpoint_id(),
                name=request.name,
                type=request.type,
                sandbox_id=info.id,
                sandbox_name=info.name,
                image=info.backend.get("image_key") or self.images.get(info.spec.image).key,
                spec=info.spec,
                backend=info.spec.backend,
                backend_state=info.backend,
                created_at=now,
                expires_at=now + request.ttl_secs if request.ttl_secs else None,
                sha256=None,
                size_bytes=0,
                metadata=request.metadata,
            )
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
                raise
            faults.point("checkpoint.before_outcome")
            self.store.transition(info.id, S.RUNNING, f"checkpoint {checkpoint.id} ready")
            elapsed = time.monotonic() - started
            self.metrics.checkpoint_seconds.observe(elapsed)
            log.info("checkpoint %s (%s) of %s in %.3fs, %d bytes", checkpoint.id, request.type.value, info.id,
                     elapsed, size)  # fmt: skip
            return checkpoint

    def list_checkpoints(self) -> list[CheckpointInfo]:
        return self.store.list_checkpoints()

    def get_checkpoint(self, ref: str) -> CheckpointInfo:
        return self.store.get_checkpoint(ref)

    def delete_checkpoint(self, ref: str) -> CheckpointInfo:
        checkpoint = self.store.get_checkpoint(ref)
        self.store.delete_checkpoint(checkpoint.id)  # the record first: a crash leaves a directory the sweep removes
        self.checkpoint_files.remove(checkpoint.id)
        log.info("deleted checkpoint %s", checkpoint.id)
        return checkpoint

    async def fork(self, ref: str, times: int) -> list[SandboxInfo]:
        """Live copies: each continues from this instant (memory, processes, files), then diverges."""
        parent = self.store.get(ref)
        request = CreateCheckpointRequest(type=CheckpointType.MEMORY, metadata={"fork_of": parent.id})
        checkpoint = await self.checkpoint(ref, request, internal=True)
        faults.point("fork.after_checkpoint")
        try:
            spec = {"timeout_secs": parent.spec.timeout_secs, "on_idle": parent.spec.on_idle}
            children = await asyncio.gather(
                *(
                    self.create(
                        CreateSandboxRequest(
                            name=f"{parent.name}-{secrets.token_hex(3)}" if parent.name else None,
                            snapshot_id=checkpoint.id,
                            backend=parent.spec.backend,
                            **spec,
                        ),
                        verify=False,  # made a moment ago by this daemon
                    )
                    for _ in range(times)
                ),
                return_exceptions=True,
            )
            faults.point("fork.after_children")
        finally:
            self.store.delete_checkpoint(checkpoint.id)
            self.checkpoint_files.remove(checkpoint.id)
        failures = [c for c in children if isinstance(c, BaseException)]
        if failures:
            for child in children:
                if isinstance(child, SandboxInfo):
                    await self.terminate(child.id)
            raise failures[0]
        return [c for c in children if isinstance(c, SandboxInfo)]

    def disk_usage(self) -> DiskUsage:
        sandboxes = (
            {p.name: tree_bytes(p) for p in self.paths.sandboxes.iterdir()} if self.paths.sandboxes.exists() else {}
        )
        checkpoints = {c.id: c.size_bytes for c in self.store.list_checkpoints(include_internal=True)}
        images = sum(i.size_bytes for i in self.images.list())
        return DiskUsage(
            sandboxes_bytes=sum(sandboxes.values()),
            checkpoints_bytes=sum(checkpoints.values()),
            images_bytes=images,
            sandboxes=sandboxes,
            checkpoints=checkpoints,
            shared_note=(
                "every sandbox and checkpoint shares its image read-only (counted once, under images); "
                "checkpoint files are copies (reflinks where the filesystem supports them)"
            ),
        )

    async def expire_checkpoints(self) -> None:
        now = time.time()
        for checkpoint in self.store.list_checkpoints():
            if checkpoint.expires_at is not None and checkpoint.expires_at <= now:
                log.warning("checkpoint %s (%s) reached its TTL: deleting it", checkpoint.id, checkpoint.name)
                self.delete_checkpoint(checkpoint.id)

    async def suspend(self, ref: str, *, only_if_idle: bool = False) -> SandboxInfo:
        info = self.store.get(ref)
        async with self._lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.SUSPENDED:
                return info
            self._require(info, S.RUNNING)
            backend, box = self._backend(info), self._box(info)
            channel = await self._channel(info)
            if only_if_idle and not self._is_idle(info):
                return info  # used since the reaper looked: no await between this check and the intent
            self.store.transition(info.id, S.SUSPENDING, "idle" if only_if_idle else None)
            faults.point("suspend.after_intent")
            started = time.monotonic()
            try:
                await backend.suspend(box, channel)
            except BaseException as exc:
                await self._rollback_suspend(info, box, exc)
                raise
            self._channels.pop(info.id, None)
            elapsed = time.monotonic() - started
            faults.point("suspend.before_outcome")
            info = self.store.transition(info.id, S.SUSPENDED, f"{elapsed:.3f}s", last_suspend_seconds=elapsed)
            self.metrics.suspend_seconds.observe(elapsed)
            log.info("suspended %s in %.3fs%s", info.id, elapsed, " (idle)" if only_if_idle else "")
            return info

    async def _rollback_suspend(self, info: SandboxInfo, box: BoxRef, exc: BaseException) -> None:
        """A failed suspend never turns into a kill: back to running if the sandbox still runs."""
        backend = self._backend(info)
        await backend.discard_partial(box)
        if await backend.host_state(box) == HostState.RUNNING:
            self._channels.pop(info.id, None)
            with contextlib.suppress(Exception):
                self._channels[info.id] = await backend.connect(box)
            self.store.transition(info.id, S.RUNNING, "suspend rolled back", error=f"suspend failed: {exc}")
        else:
            self.store.transition(info.id, S.FAILED, error=f"suspend failed and the sandbox stopped: {exc}")

    async def resume(self, ref: str) -> SandboxInfo:
        info = self.store.get(ref)
        async with self._lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.RUNNING:
                return info
            backend, box = self._backend(info), self._box(info)
            # A failed sandbox whose files survived (e.g. the host rebooted under it) boots again with them.
            cold = info.status == S.FAILED and box.directory.exists()
            if not cold:
                self._require(info, S.SUSPENDED)
            self.store.transition(info.id, S.RESUMING, "cold boot with its files" if cold else None)
            faults.point("resume.after_intent")
            started = time.monotonic()
            try:
                if cold:
                    channel, backend_state = await backend.start(box)
                    backend_state = {**info.backend, **backend_state}
                else:
                    channel, backend_state = await backend.resume(box), info.backend
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
            self._activity[info.id] = time.time()
            self.metrics.resume_seconds.observe(elapsed)
            log.info("resumed %s in %.3fs", info.id, elapsed)
            return info

    async def terminate(self, ref: str, *, only_if_idle: bool = False) -> SandboxInfo:
        info = self.store.get(ref)
        async with self._lock(info.id):
            info = self.store.get(info.id)
            if info.status == S.TERMINATED:
                return info
            if only_if_idle and (info.status != S.RUNNING or not self._is_idle(info)):
                return info
            if info.status != S.TERMINATING:
                self.store.transition(info.id, S.TERMINATING)
            faults.point("terminate.after_intent")
            channel = self._channels.pop(info.id, None)
            if channel is not None:
                await channel.close()
            faults.point("terminate.after_close")
            await self._backend(info).destroy(self._box_or_bare(info))
            faults.point("terminate.before_outcome")
            info = self.store.transition(info.id, S.TERMINATED)
        self._locks.pop(info.id, None)
        self._activity.pop(info.id, None)
        self._inflight.pop(info.id, None)
        log.info("terminated %s%s", info.id, " (idle)" if only_if_idle else "")
        return info

    def _box_or_bare(self, info: SandboxInfo) -> BoxRef:
        """A BoxRef even if the image is gone: destroying must always work."""
        try:
            return self._box(info)
        except StasisError:
            return BoxRef(
                info.id,
                info.name or info.id,
                info.spec,
                self.paths.sandboxes / info.id,
                Path("/"),
                info.backend,
            )

    def _require(self, info: SandboxInfo, wanted: SandboxStatus) -> None:
        if info.status != wanted:
            why = WHY_NOT[info.status].format(name=info.name or info.id, error=info.error)
            raise StateError(f"sandbox {info.name or info.id!r} {why}", status=info.status.value)

    # ------------------------------------------------------------ recovery

    async def recover(self) -> None:
        """Make the store and the host agree after a restart, sandbox by sandbox."""
        for checkpoint_id in self.store.unfinished_checkpoints():
            log.warning("removing checkpoint %s: its writing was cut off (or it was a fork's)", checkpoint_id)
            self.store.delete_checkpoint(checkpoint_id)
        for name in self.checkpoint_files.sweep(keep=self.store.all_checkpoint_ids()):
            log.warning("removed checkpoint directory %s that no checkpoint owns", name)
        for info in self.store.list():
            try:
                await self._recover_one(info)
            except Exception as exc:
                log.exception("recovery of %s failed", info.id)
                with contextlib.suppress(Exception):
                    self.store.transition(info.id, S.FAILED, error=f"recovery failed: {exc}")
        await self._reap_leftovers()

    async def _recover_one(self, info: SandboxInfo) -> None:
        backend = self._backend(info)
        box = self._box_or_bare(info)
        host = await backend.host_state(box)
        log.info("recovering %s: store says %s, host says %s", info.id, info.status.value, host.value)
        if info.status == S.PENDING:
            await self._discard(info, box, "the daemon stopped while the sandbox was being created")
        elif info.status == S.TERMINATING:
            await self.terminate(info.id)
        elif info.status == S.SNAPSHOTTING:
            if host == HostState.RUNNING:
                await self._adopt(info, box, "checkpoint cut off; the sandbox goes on")  # connect() unpauses
            else:
                await backend.stop(box)
                self.store.transition(info.id, S.FAILED, error="the sandbox stopped during a checkpoint")
        elif info.status in (S.RUNNING, S.SUSPENDING):
            if host == HostState.RUNNING:
                await backend.discard_partial(box)
                await self._adopt(info, box, "re-adopted after daemon restart")
            elif host == HostState.SUSPENDED:
                await backend.stop(box)
                if info.status == S.RUNNING:
                    self.store.transition(info.id, S.SUSPENDING, "found suspended on the host")
                self.store.transition(info.id, S.SUSPENDED, "suspend completed during recovery")
            elif info.status == S.SUSPENDING and (channel := await backend.salvage(box)) is not None:
                self._channels[info.id] = channel
                self.store.transition(info.id, S.RUNNING, "suspend was cut off; restored from its image")
            else:
                await backend.stop(box)
                reason = (
                    "its processes were gone when the daemon started (host restart or crash); "
                    "its files are kept and resuming boots it again with them"
                )
                self.store.transition(info.id, S.FAILED, error=reason)
        elif info.status == S.RESUMING:
            if host == HostState.RUNNING:
                await backend.discard_suspend_image(box)
                await self._adopt(info, box, "resume completed during recovery")
            else:
                await backend.stop(box)
                if host == HostState.SUSPENDED:
                    self.store.transition(info.id, S.SUSPENDED, "resume rolled back during recovery")
                else:
                    self.store.transition(info.id, S.FAILED, error="a cold boot was interrupted; resume to retry")
        elif info.status == S.SUSPENDED:
            await backend.stop(box)  # nothing may run for a suspended sandbox
            if host == HostState.STOPPED:
                self.store.transition(info.id, S.FAILED, error="its suspend image is missing")

    async def _adopt(self, info: SandboxInfo, box: BoxRef, detail: str) -> None:
        channel = await self._backend(info).connect(box)
        self._channels[info.id] = channel
        self._activity[info.id] = time.time()  # a restarted daemon gives every sandbox a full idle window
        if info.status != S.RUNNING:
            self.store.transition(info.id, S.RUNNING, detail)

    async def _reap_leftovers(self) -> None:
        live = {info.id for info in self.store.list()}
        for backend in self.backends.values():
            for sandbox_id in await backend.leftovers(live):
                log.warning("reaping runsc container %s that no live sandbox owns", sandbox_id)
                await backend.delete_container(sandbox_id)
        for directory in self.paths.sandboxes.iterdir() if self.paths.sandboxes.exists() else []:
            if directory.name not in live:
                log.warning("removing %s: no live sandbox owns it", directory)
                await asyncio.to_thread(shutil.rmtree, directory, True)

    # ------------------------------------------------------------ the guest

    async def _channel(self, info: SandboxInfo) -> GuestChannel:
        channel = self._channels.get(info.id)
        if channel is None or channel.closed:
            channel = await self._backend(info).connect(self._box(info))
            self._channels[info.id] = channel
        return channel

    @contextlib.asynccontextmanager
    async def _guest(self, ref: str) -> AsyncIterator[GuestChannel]:
        """The channel of the sandbox, resumed first if it was suspended.

        While the block runs the sandbox counts as in use, so the idle reaper leaves it alone.
        """
        info = self.store.get(ref)
        self._inflight[info.id] = self._inflight.get(info.id, 0) + 1
        self._activity[info.id] = time.time()
        try:
            info = await self._ensure_running(info)
            channel = await self._channel(info)
            try:
                yield channel
            except GuestDisconnected:
                await self._check_alive(info)
                raise
        finally:
            self._inflight[info.id] -= 1
            self._activity[info.id] = time.time()

    async def _ensure_running(self, info: SandboxInfo) -> SandboxInfo:
        """Auto-resume. Concurrent callers queue on the sandbox's lock and share one resume."""
        if info.status == S.RUNNING:
            return info
        if info.status in (S.PENDING, S.SNAPSHOTTING):  # brief: wait for the operation, then go on
            async with self._lock(info.id):
                info = self.store.get(info.id)
        if info.status in (S.SUSPENDED, S.SUSPENDING, S.RESUMING):
            resumed = await self.resume(info.id)
            if resumed.status == S.RUNNING:
                if info.status != S.RUNNING:
                    self.metrics.auto_resumes.inc()
                return resumed
            info = resumed
        self._require(info, S.RUNNING)
        return info

    # ------------------------------------------------------------ idleness

    def _is_idle(self, info: SandboxInfo) -> bool:
        if info.spec.timeout_secs is None or self._inflight.get(info.id, 0) > 0:
            return False
        last = self._activity.get(info.id, info.last_activity)
        return time.time() - last >= info.spec.timeout_secs

    async def _idle_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(IDLE_TICK)
            ticks += 1
            try:
                if ticks % 30 == 0:
                    self._persist_activity()
                if ticks % 10 == 0:
                    await self.expire_checkpoints()
                for info in self.store.list():
                    if info.status == S.RUNNING and info.id not in self._idle_busy and self._is_idle(info):
                        self._idle_busy.add(info.id)
                        task = asyncio.get_running_loop().create_task(self._idle_action(info))
                        task.add_done_callback(lambda _t, sid=info.id: self._idle_busy.discard(sid))
            except Exception:  # the reaper must outlive any one bad tick
                log.exception("idle reaper tick failed")

    async def _idle_action(self, info: SandboxInfo) -> None:
        action = idle_action(info)
        try:
            if action == "terminate":
                done = await self.terminate(info.id, only_if_idle=True)
                acted = done.status == S.TERMINATED
            else:
                done = await self.suspend(info.id, only_if_idle=True)
                acted = done.status == S.SUSPENDED
            if acted:
                self.metrics.idle_actions.labels(action).inc()
        except Exception as exc:  # a failed idle suspend leaves the sandbox running, with the error on record
            log.warning("idle %s of %s failed: %s", action, info.id, exc)
            self.metrics.idle_failures.inc()

    async def _check_alive(self, info: SandboxInfo) -> None:
        current = self.store.get(info.id)
        if current.status != S.RUNNING:
            return
        backend = self._backend(current)
        if await backend.host_state(self._box(current)) != HostState.RUNNING:
            reason = "the sandbox stopped unexpectedly (out of memory, or killed on the host)"
            self._channels.pop(info.id, None)
            self.store.transition(info.id, S.FAILED, error=reason)
            raise StateError(f"sandbox {current.name or current.id!r}: {reason}")
