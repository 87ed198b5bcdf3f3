"""The E2B room: E2B's sandbox lifecycle over stasis' rooms (the front desk, the core, checkpoints, forks).

What E2B adds to a stasis sandbox that stasis has no field for (its template name, metadata, envs, public
traffic) is a :class:`Record`. Its lifetime is the core's: E2B's timeout is the sandbox's ``lifetime_secs``
and deadline, and its end (killed, or with ``auto_pause`` suspended, memory and processes kept) is the
sandbox's idle action, run by the one reaper (:mod:`...rooms.idle`), never by this face. ``connect``
resumes a paused one and extends its lifetime. E2B's "paused" is stasis' suspended: any envd call resumes it.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ....desktop import GLIB_SPAWN_SHIM
from ....desktop import IMAGE as DESKTOP_IMAGE
from ....e2b_wire import BASE_IMAGE, code_template_name
from ....e2b_wire import CODE_IMAGE as E2B_CODE_IMAGE
from ....errors import ImageNotFound, InvalidRequest, NotFound, SandboxNotFound, StasisError, echo
from ....guest import protocol as P
from ....kernels import E2B_TEMPLATE as E2B_CODE_TEMPLATE
from ....kernels import IMAGE as CODE_IMAGE
from ....models import (
    MAX_SECONDS,
    TEMPLATE_PREFIX,
    CheckpointInfo,
    CheckpointType,
    CreateCheckpointRequest,
    CreateSandboxRequest,
    SandboxInfo,
    SandboxStatus,
)
from ....netpolicy import NetworkPolicy
from ....volume_models import VolumeMount
from ...core.service import SandboxService
from ...rooms import image_use
from ...rooms.audit import AuditLog
from ...rooms.checkpointing import Checkpoints
from ...rooms.forks import fork
from ...rooms.front import Front
from ...rooms.secrets import SecretsRoom
from ...rooms.teams import TeamsRoom
from ...rooms.volumes import VolumesRoom
from ...rooms.webhooks import WebhooksRoom
from .keys import E2bKeys
from .records import Record, Records
from .template_builder import TemplateBuilder
from .templates import Template, Templates

log = logging.getLogger(__name__)

S = SandboxStatus
BASE_TEMPLATE = "base"  # E2B's default template
TEMPLATE_IMAGES = {BASE_TEMPLATE: BASE_IMAGE, E2B_CODE_TEMPLATE: E2B_CODE_IMAGE}  # E2B's names for stasis images
DEFAULT_TIMEOUT = 300  # E2B's default lifetime, seconds
MAX_TIMEOUT = MAX_SECONDS  # a year: the longest lifetime a request may name
PAUSED = (S.SUSPENDED, S.SUSPENDING)
GONE = (S.TERMINATED, S.FAILED)
# /proc/stat's cpu line twice, 0.5 s apart, then memory and the root file system: read inside the sandbox
METRICS_SCRIPT = (
    "head -1 /proc/stat; sleep 0.5; head -1 /proc/stat; grep -E '^(MemTotal|MemAvailable|Cached):' /proc/meminfo; "
    "df -P -k / | tail -1; nproc"
)


@dataclass(frozen=True)
class Defaults:
    """What a listener creates when E2B does not say (E2B has no backend, and templates carry the size)."""

    backend: str
    memory_mb: int = 1024
    cpus: float = 1.0
    build_network: bool = False  # whether a template build's steps reach the network (E2B's always do)


class E2bRoom:
    def __init__(
        self, core: SandboxService, front: Front, checkpoints: Checkpoints, keys: E2bKeys, secrets: SecretsRoom,
        volumes: VolumesRoom,
    ) -> None:  # fmt: skip
        self.core = core
        self.front = front
        self.secrets = secrets  # E2B's secrets API is stasis' secret store
        self.checkpoints = checkpoints
        self.keys = keys
        self.records = Records(core.paths.home / "e2b")
        self.templates = Templates(core.paths.home)
        self.builder = TemplateBuilder(self.templates, core.paths)
        self.builder.recover()
        self.volumes = volumes
        self.code_interpreter: Callable[[str], Awaitable[None]] | None = None  # starts run_code's server (CodeRoom)
        self.teams: TeamsRoom | None = None  # a team's key at this door (set in the wiring)
        self.audit: AuditLog | None = None  # the daemon's audit log (set in the wiring)
        self.webhooks: WebhooksRoom | None = None  # E2B's lifecycle webhooks are stasis' (set in the wiring)
        self.private_webhooks = os.environ.get("STASIS_WEBHOOKS_ALLOW_PRIVATE") == "1"  # the owner's E2B key's
        self._gone: dict[str, Record] = {}  # records of sandboxes just ended, for their last events' payloads

    # -- lifecycle

    async def create(
        self, defaults: Defaults, template: str, timeout: int | None, auto_pause: bool, metadata: dict[str, str],
        envs: dict[str, str], network: NetworkPolicy | None, public_traffic: bool = False,
        egress_headers: dict[str, dict[str, str]] | None = None, keep_memory: bool = True,
        volumes: list[VolumeMount] | None = None, team: str | None = None,
    ) -> tuple[SandboxInfo, Record]:  # fmt: skip
        lifetime = {"timeout_secs": None, "lifetime_secs": _timeout(timeout),  # E2B's timeout, and no idle window
                    "on_idle": "suspend" if auto_pause else "terminate", "keep_memory": keep_memory,
                    "volumes": volumes or []}  # fmt: skip
        request = self._request(defaults, template, network, egress_headers or {}, lifetime)
        request = request.model_copy(update={"team": team})
        if request.image == DESKTOP_IMAGE:  # XFCE's and gtk-launch's GLib spawns need it under gVisor
            envs = {"LD_PRELOAD": GLIB_SPAWN_SHIM, **envs}
        info = await self.front.create(request)
        if request.image in (CODE_IMAGE, E2B_CODE_IMAGE) and self.code_interpreter is not None:
            await self.code_interpreter(info.id)  # E2B's code-interpreter SDK calls port 49999 at once
        record = Record(sandbox_id=info.id, template=template, metadata=metadata, envs=envs,
                        public_traffic=public_traffic, e2b=True)  # fmt: skip
        self.records.put(record)
        log.info("E2B sandbox %s from template %r, lifetime %ss", info.id, template, _timeout(timeout))
        return info, record

    def _request(
        self,
        defaults: Defaults,
        template: str,
        network: NetworkPolicy | None,
        egress_headers: dict[str, Any],
        lifetime: dict[str, Any],
    ) -> CreateSandboxRequest:
        """A template is a stasis image, a stasis template, or a snapshot (a MEMORY checkpoint's id or name)."""
        base: dict[str, Any] = {"backend": defaults.backend, "memory_mb": defaults.memory_mb, "cpus": defaults.cpus,
                                "network": network, **lifetime}  # fmt: skip
        if egress_headers:
            base["egress_headers"] = egress_headers
        # a warm template restores with the volumes it was made with (none): a sandbox with volumes boots its image
        warm_ok = not lifetime.get("volumes")
        if built := self.templates.resolve(template):  # a template built through E2B's Template API
            size = {"cpus": float(built[1].cpu_count), "memory_mb": built[1].memory_mb}
            if built[1].warm and not warm_ok:
                raise InvalidRequest(f"template {echo(template)} starts warm (its start command already running), "
                                     "and a warm start keeps the mounts it was made with: mount no volume, or build "
                                     "the template without a start command")  # fmt: skip
            if built[1].warm:
                return CreateSandboxRequest(template=built[1].warm, **(base | size))
            return CreateSandboxRequest(image=built[1].image, **(base | size))
        if template == E2B_CODE_TEMPLATE and warm_ok and self._warm_code_template(defaults.backend):
            warm = code_template_name(defaults.backend)
            return CreateSandboxRequest(template=warm, **base)  # its kernel already running and warm
        name = TEMPLATE_IMAGES.get(template, template)
        with contextlib.suppress(ImageNotFound, InvalidRequest):
            self.core.images.get(name)
            if name == DESKTOP_IMAGE:  # E2B Desktop's SDK starts its own X server and XFCE in it
                base["desktop_session"] = False
            return CreateSandboxRequest(image=name, **base)
        if template != BASE_TEMPLATE:
            with contextlib.suppress(NotFound, InvalidRequest):
                self.checkpoints.get(TEMPLATE_PREFIX + template)
                return CreateSandboxRequest(template=template, **base)
            with contextlib.suppress(NotFound, InvalidRequest):
                checkpoint = self.checkpoints.get(template)
                return CreateSandboxRequest(snapshot_id=checkpoint.id, **base)
        hint = " (`stasis e2b serve` builds it)" if template in (BASE_TEMPLATE, E2B_CODE_TEMPLATE) else ""
        raise NotFound(
            f"template {echo(template)} not found{hint}: a template is a stasis image (`stasis image ls`), "
            "a stasis template (`stasis template ls`) or a snapshot id"
        )

    def _warm_code_template(self, backend: str) -> bool:
        """Whether E2B's code-interpreter-v1 has its warm template on this backend (`stasis e2b serve` makes it):
        it then starts with its kernel running instead of from the image."""
        try:
            return self.checkpoints.get(TEMPLATE_PREFIX + code_template_name(backend)).backend == backend
        except (NotFound, InvalidRequest):
            return False

    def record(self, info: SandboxInfo) -> Record:
        """Its E2B record. A sandbox made by stasis, not through this face, has none and gets none: it keeps
        stasis' own idle policy."""
        if (record := self.records.get(info.id)) is not None:
            return record
        return Record(sandbox_id=info.id, template=info.spec.image, e2b=False)

    @staticmethod
    def ends_at(info: SandboxInfo) -> float:
        """When its lifetime ends, as E2B shows it: its deadline (E2B's timeout), or for a sandbox stasis made
        its idle deadline."""
        return info.deadline or info.idle_action_at or time.time() + (info.spec.timeout_secs or MAX_TIMEOUT)

    async def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone: its record goes with it (the core's teardown hook), kept a while in memory for the
        payloads of its last events."""
        if (record := self.records.get(sandbox_id)) is not None:
            self._gone[sandbox_id] = record
            while len(self._gone) > 1000:
                self._gone.pop(next(iter(self._gone)))
        self.records.remove(sandbox_id)

    def describe(self, sandbox_id: str) -> dict[str, Any]:
        """What E2B's event payloads say of a sandbox: its metadata, template, CPUs and memory."""
        record = self.records.get(sandbox_id) or self._gone.get(sandbox_id)
        try:
            spec = self.core.record(sandbox_id).spec
            size = {"cpus": max(1, round(spec.cpus)), "memory_mb": spec.memory_mb}
        except NotFound:
            size = {}
        return {"metadata": record.metadata if record else {}, "template": record.template if record else "", **size}

    def sandbox(self, ref: str) -> SandboxInfo:
        """A live sandbox by E2B id (a stasis id or name); E2B's 404 otherwise."""
        try:
            info = self.core.lookup(ref)
        except (SandboxNotFound, InvalidRequest):
            raise SandboxNotFound(f"sandbox {echo(ref)} was not found") from None  # E2B's words: its SDKs read them
        if info.status in GONE:
            raise SandboxNotFound(f"sandbox {echo(ref)} was not found (it is {info.status.value})")
        return info

    def listing(self, team: str | None = None) -> list[tuple[SandboxInfo, Record]]:
        """Live sandboxes (``team``'s alone, if given)."""
        return [
            (info, self.record(info))
            for info in self.core.list(include_terminated=False)
            if info.status not in GONE and info.pool is None and (team is None or info.spec.team == team)
        ]

    async def kill(self, ref: str) -> None:
        await self.core.terminate(self.sandbox(ref).id)

    async def set_timeout(self, ref: str, timeout: int) -> SandboxInfo:
        info = self.sandbox(ref)
        if not self.record(info).e2b:
            raise InvalidRequest(
                f"sandbox {info.name or info.id} was made by stasis, not through E2B: it has no E2B lifetime and "
                f"keeps stasis' idle policy ({_idle_policy(info)}); `stasis rm` ends it"
            )
        return await self.core.set_lifetime(info.id, _timeout(timeout))

    async def pause(self, ref: str, keep_memory: bool = True) -> SandboxInfo:
        """E2B's pause: stasis' suspend (``keep_memory`` False: its files only, and a resume boots it again)."""
        return await self.core.suspend(self.sandbox(ref).id, keep_memory=keep_memory)

    async def connect(self, ref: str, timeout: int | None) -> tuple[SandboxInfo, Record, bool]:
        """Resume it if paused; its lifetime runs at least ``timeout`` from now. True if it was resumed."""
        info = self.sandbox(ref)
        resumed = info.status in PAUSED
        if resumed:
            info = await self.front.resume(info.id)
        record = self.record(info)
        if record.e2b:  # a stasis-made sandbox keeps its own idle policy; a resumed one's lifetime starts anew
            info = await self.core.set_lifetime(info.id, _timeout(timeout), extend_only=not resumed)
        return info, record, resumed

    async def fork(self, ref: str, count: int, timeout: int | None) -> list[tuple[SandboxInfo, Record]]:
        parent = self.sandbox(ref)
        parent_record = self.record(parent)
        children = await fork(self.core, self.checkpoints, parent.id, count)
        made = []
        for child in children:
            record = parent_record.model_copy(update={"sandbox_id": child.id, "e2b": True})  # made through this face
            self.records.put(record)
            made.append((await self.core.set_lifetime(child.id, _timeout(timeout)), record))
        return made

    async def snapshot(self, ref: str, name: str | None, memory: bool = True) -> CheckpointInfo:
        """A checkpoint: MEMORY (E2B's full snapshot: restores with its processes) or FILESYSTEM (cold boots)."""
        info = self.sandbox(ref)
        kind = CheckpointType.MEMORY if memory else CheckpointType.FILESYSTEM
        request = CreateCheckpointRequest(type=kind, name=name, metadata={"e2b_template": self.record(info).template})
        return await self.checkpoints.take(info.id, request)

    def snapshots(self, sandbox_id: str | None) -> list[CheckpointInfo]:
        """Checkpoints a sandbox can be created from (a template's own are stasis' business)."""
        return [
            c
            for c in self.checkpoints.list()
            if not (c.name or "").startswith(TEMPLATE_PREFIX) and (sandbox_id is None or c.sandbox_id == sandbox_id)
        ]

    def delete_snapshot(self, ref: str) -> None:
        checkpoint = self.checkpoints.get(ref)
        if (checkpoint.name or "").startswith(TEMPLATE_PREFIX):
            raise InvalidRequest(f"{echo(ref)} is a stasis template: remove it with `stasis template rm`")
        self.checkpoints.delete(checkpoint.id)

    def forget_template(self, template: Template) -> None:
        """A built template's record, its warm templates and its images (unless a sandbox still uses one: then they
        stay for `stasis image prune`); its steps' cached layers stay, shared with any build of the same steps."""
        for build in template.builds.values():
            if build.warm:
                with contextlib.suppress(NotFound, InvalidRequest):
                    self.checkpoints.delete(self.checkpoints.get(TEMPLATE_PREFIX + build.warm).id)
        with contextlib.suppress(StasisError):
            image_use.remove(self.core, self.checkpoints, f"e2b-{template.template_id}")
        self.templates.remove(template)

    async def update_network(self, ref: str, policy: NetworkPolicy) -> SandboxInfo:
        return await self.core.set_network(self.sandbox(ref).id, policy)

    async def metrics(self, ref: str) -> dict[str, float] | None:
        """One sample, taken now inside a running sandbox (a paused one has none and is not woken for it)."""
        info = self.sandbox(ref)
        if info.status != S.RUNNING:
            return None
        async with self.core.guest(info.id) as channel:
            result = await channel.call(P.Exec(cmd=["sh", "-c", METRICS_SCRIPT], timeout=30), timeout=60)
        return parse_metrics(base64.b64decode(result.stdout).decode(errors="replace"))

    # -- records

    async def sweep(self) -> None:
        """At start: records of sandboxes that ended while no daemon watched go (a record goes with its sandbox
        otherwise); an older daemon's E2B lifetime (kept in its record) becomes the sandbox's own."""
        for record in self.records.all():
            try:
                gone = self.core.record(record.sandbox_id).status in GONE
            except SandboxNotFound:
                gone = True
            if gone:
                self.records.remove(record.sandbox_id)
            elif (older := self.records.older_lifetime(record.sandbox_id)) is not None:
                end_at, auto_pause = older
                end = "suspend" if auto_pause else "terminate"
                try:
                    await self.core.set_lifetime(record.sandbox_id, max(0.0, end_at - time.time()), on_end=end)
                except StasisError as exc:  # a failed one, say: it keeps what it had
                    log.warning("E2B sandbox %s keeps its idle policy: %s", record.sandbox_id, exc)
                self.records.put(record)  # rewritten without it: done once


def _idle_policy(info: SandboxInfo) -> str:
    if info.spec.timeout_secs is None:
        return "it never idles out"
    return f"{info.idle_action or 'suspend'} after {info.spec.timeout_secs} s idle"


def _timeout(timeout: int | None) -> int:
    if timeout is None:
        return DEFAULT_TIMEOUT
    if timeout < 0:
        raise InvalidRequest(f"timeout must be a number of seconds >= 0, got {timeout}")
    return min(timeout, MAX_TIMEOUT)


def parse_metrics(text: str) -> dict[str, float]:
    lines = text.splitlines()
    first, second = ([int(v) for v in line.split()[1:]] for line in lines[:2])
    busy = lambda t: sum(t) - t[3] - (t[4] if len(t) > 4 else 0)  # noqa: E731 (all but idle and iowait)
    total = sum(second) - sum(first)
    memory = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines[2:5]}
    disk = lines[5].split()
    return {
        "cpu_used_pct": round(100.0 * (busy(second) - busy(first)) / total, 2) if total > 0 else 0.0,
        "mem_total": memory.get("MemTotal", 0), "mem_used": memory.get("MemTotal", 0) - memory.get("MemAvailable", 0),
        "mem_cache": memory.get("Cached", 0), "disk_total": int(disk[1]) * 1024, "disk_used": int(disk[2]) * 1024,
        "cpu_count": int(lines[6]),
    }  # fmt: skip
