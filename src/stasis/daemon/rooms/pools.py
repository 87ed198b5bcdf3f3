"""Warm pools: sandboxes of one spec started ahead and handed out by a matching create.

A member is an ordinary sandbox record whose ``pool`` column names its pool: it boots, is recovered
after a daemon restart and is removed like any sandbox, but it is nobody's until claimed (the list
leaves it out, it never idles out). A claim is one store transaction that clears ``pool`` and gives
the member the caller's name and idle policy; the member then gets an identity of its own (a new
machine id, and where its kernel lets it a hostname and reseeded RNG) before the caller sees it.
A refill task per pool starts members until the pool is full again.

Pools are bounded by a memory budget: the memory limits of all their members together at most
``STASIS_POOL_MEMORY_MB`` (default: half the host's RAM).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import time
import uuid

from ...errors import InvalidRequest, NotFound, StasisError
from ...guest import protocol as P
from ...models import CreateSandboxRequest, SandboxInfo, SandboxStatus
from ...pool_models import CreatePoolRequest, PoolInfo
from ..core.service import SandboxService
from ..core.sources import CheckpointsRead, source_of, template_checkpoint
from ..core.tables import PoolTable

log = logging.getLogger(__name__)

S = SandboxStatus
PARALLEL_STARTS = 2  # members a pool starts at once: a refill must not starve the sandboxes in use
RECHECK_SECS = 5.0  # a refill looks again this often even unwoken (a member may have died)
BACKOFF_SECS = (2.0, 60.0)  # after a failed start: first wait, longest wait
# A claim's first commands come right after it: a refill that boots at once takes the CPU they need
# (create → first exec 77 ms with an immediate refill, 2 cores).
REFILL_DELAY_SECS = 0.5


def memory_budget_mb() -> int:
    configured = os.environ.get("STASIS_POOL_MEMORY_MB")
    if configured:
        return int(configured)
    return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20) // 2


class PoolManager:
    def __init__(self, service: SandboxService, table: PoolTable, checkpoints: CheckpointsRead) -> None:
        self.service = service
        self.table = table  # the pools table: this room is its one writer (members are the core's rows)
        self.checkpoints = checkpoints
        self.specs: dict[str, CreatePoolRequest] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._claimed: dict[str, int] = {}
        self._errors: dict[str, str] = {}

    # ------------------------------------------------------------ start-up and shutdown

    async def start(self) -> None:
        """After recovery: members that no pool owns (a removal cut short by a crash) or that did not
        survive the restart are removed; every pool is refilled."""
        self.specs = {name: CreatePoolRequest.model_validate_json(spec) for name, spec in self.table.pools().items()}
        for member in self.service.pool_members():
            if member.pool not in self.specs or member.status != S.RUNNING:
                log.warning("removing pool member %s (%s): %s", member.id, member.pool, member.status.value)
                await self._remove(member)
        for name in self.specs:
            self._start_refill(name)

    async def close(self) -> None:
        """Stop refilling; a member being started is rolled back, the waiting ones keep running."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    # ------------------------------------------------------------ pools

    async def create(self, request: CreatePoolRequest) -> PoolInfo:
        service = self.service
        service.available(request.backend)  # refused now, not in a refill loop later
        service.images.get(request.image)
        if request.template is not None:
            template_checkpoint(self.checkpoints, request.template)
        reserved = sum(p.size * p.memory_mb for p in self.specs.values())
        budget = memory_budget_mb()
        if reserved + request.size * request.memory_mb > budget:
            raise InvalidRequest(
                f"pool {request.name!r} would reserve {request.size} x {request.memory_mb} MiB, but the pools' memory "
                f"budget is {budget} MiB and {reserved} MiB of it is taken; make it smaller (--size, --memory), "
                "remove another pool, or raise STASIS_POOL_MEMORY_MB"
            )
        self.table.save_pool(request.name, request.model_dump_json(exclude_unset=True))  # a template's: see matches
        self.specs[request.name] = request
        self._start_refill(request.name)
        log.info("pool %s: %d x %s on %s", request.name, request.size, request.image, request.backend)
        return self.describe(request.name)

    def list(self) -> list[PoolInfo]:
        return [self.describe(name) for name in self.specs]

    def describe(self, name: str) -> PoolInfo:
        spec = self._spec(name)
        members = self.service.pool_members(name)
        return PoolInfo(
            name=name,
            spec=spec,
            ready=sum(m.status == S.RUNNING for m in members),
            starting=sum(m.status == S.PENDING for m in members),
            claimed=self._claimed.get(name, 0),
            last_error=self._errors.get(name),
            members=[m.id for m in members],
        )

    async def remove(self, name: str) -> PoolInfo:
        """The pool first (no claim or refill after this), then every waiting member."""
        info = self.describe(name)
        self.table.delete_pool(name)
        self.specs.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(self._remove(member) for member in self.service.pool_members(name)))
        self._wake.pop(name, None)
        log.info("pool %s removed", name)
        return info

    def _spec(self, name: str) -> CreatePoolRequest:
        try:
            return self.specs[name]
        except KeyError:
            known = ", ".join(self.specs) or "none"
            raise NotFound(f"no pool named {name[:80]!r} (pools: {known}); `stasis pool ls` lists them") from None

    # ------------------------------------------------------------ claiming

    async def claim(self, request: CreateSandboxRequest) -> SandboxInfo | None:
        """A ready member of a pool whose spec the request asks for, made the caller's; None if there is none."""
        for name, spec in list(self.specs.items()):
            if not spec.matches(request):
                continue
            try:
                image_key = self.service.images.get(spec.image).key
            except StasisError:
                continue
            while (member := self.service.claim(name, image_key, request)) is not None:
                self._claimed[name] = self._claimed.get(name, 0) + 1
                self._wake_refill(name)
                try:
                    await self._make_own(member)
                except Exception as exc:  # it died waiting: never hand out a broken one
                    log.warning("claimed pool member %s is broken (%s); removing it", member.id, exc)
                    with contextlib.suppress(Exception):
                        await self.service.terminate(member.id, pooled=True)
                    continue
                self.service.activity.touch(member.id)  # its idle clock starts at the claim, not at its boot
                log.info("claimed %s from pool %s", member.id, name)
                return member
        return None

    async def _make_own(self, member: SandboxInfo) -> None:
        """Its own machine id; its hostname (the caller's name) and a reseeded RNG where the guest kernel lets
        the agent set them (a microVM). A gVisor sandbox keeps the hostname it booted with, its own id: its
        agent lacks CAP_SYS_ADMIN, and gVisor's RNG is the host's, never copied."""
        backend = self.service.backend_of(member)
        identity = P.SetIdentity(machine_id=uuid.uuid4().hex)
        if backend.sets_identity:
            identity.hostname = member.name or member.id
            identity.entropy = base64.b64encode(os.urandom(64)).decode()
            identity.time = time.time()
        async with self.service.guest(member.id, pooled=True) as channel:
            await channel.call(identity, timeout=10)

    # ------------------------------------------------------------ refilling

    def _start_refill(self, name: str) -> None:
        self._wake[name] = asyncio.Event()
        self._tasks[name] = asyncio.get_running_loop().create_task(self._refill(name), name=f"pool-{name}")

    def _wake_refill(self, name: str) -> None:
        if name in self._wake:
            self._wake[name].set()

    async def _refill(self, name: str) -> None:
        backoff = BACKOFF_SECS[0]
        while (spec := self.specs.get(name)) is not None:
            await self._drop_unusable(name, spec)
            missing = spec.size - len(self.service.pool_members(name))
            if missing <= 0:
                self._wake[name].clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake[name].wait(), RECHECK_SECS)
                    await asyncio.sleep(REFILL_DELAY_SECS)
                continue
            started = await asyncio.gather(
                *(self._start_member(name, spec) for _ in range(min(missing, PARALLEL_STARTS))),
                return_exceptions=True,
            )
            failures = [r for r in started if isinstance(r, BaseException)]
            if not failures:
                self._errors.pop(name, None)
                backoff = BACKOFF_SECS[0]
                continue
            self._errors[name] = str(failures[0])
            log.warning("pool %s: starting a member failed (retrying in %.0fs): %s", name, backoff, failures[0])
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_SECS[1])

    async def _start_member(self, name: str, spec: CreatePoolRequest) -> SandboxInfo:
        source = await source_of(spec.member_request(), self.checkpoints, self.service.images)
        return await self.service.create(None, source, pool=name)

    async def _drop_unusable(self, name: str, spec: CreatePoolRequest) -> None:
        """Members that failed, and members of an image build that is no longer the image's."""
        try:
            current = self.service.images.get(spec.image).key
        except StasisError:
            current = None
        for member in self.service.pool_members(name):
            if member.status == S.FAILED or (member.status == S.RUNNING and member.image_key != current):
                log.info("pool %s: replacing member %s (%s)", name, member.id, member.status.value)
                await self._remove(member)

    async def _remove(self, member: SandboxInfo) -> None:
        try:
            await self.service.terminate(member.id, pooled=True)
        except Exception:
            log.exception("could not remove pool member %s", member.id)
