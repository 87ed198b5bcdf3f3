"""Where a new sandbox comes from, as a value the layers above the core produce: a boot of an image
build, or a checkpoint of this node's restored. The core (:mod:`.service`) starts either, and knows
nothing of pools, templates or the remote store that chose it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ...errors import CheckpointNotFound, InvalidRequest, NotFound
from ...images import ImageStore
from ...models import TEMPLATE_PREFIX, CheckpointInfo, CheckpointType, CreateSandboxRequest, SandboxSpec


@dataclass(frozen=True)
class Boot:
    """A fresh boot of the image build ``image_key``."""

    spec: SandboxSpec
    image_key: str


@dataclass(frozen=True)
class Restore:
    """A checkpoint of this node's: its files, and for a MEMORY one its processes."""

    checkpoint: CheckpointInfo
    spec: SandboxSpec
    verify: bool = True  # check its bytes first (not for one this daemon wrote a moment ago: a fork's)

    @property
    def image_key(self) -> str:
        return self.checkpoint.image


Source = Boot | Restore
PullCheckpoint = Callable[[str], Awaitable[None]]


class CheckpointsRead(Protocol):
    """What a create reads of the checkpoints (their room, :mod:`..rooms.checkpointing`, owns them)."""

    def get(self, ref: str) -> CheckpointInfo: ...
    def list(self, include_internal: bool = False) -> list[CheckpointInfo]: ...


async def source_of(
    request: CreateSandboxRequest,
    checkpoints: CheckpointsRead,
    images: ImageStore,
    pull: PullCheckpoint | None = None,
) -> Source:
    """What ``request`` asks for: a template's checkpoint, a checkpoint (fetched by ``pull`` from the remote
    store if this node lacks it), or a boot of its image's current build."""
    snapshot = request.snapshot_id
    if request.template is not None and snapshot is None:
        snapshot = template_checkpoint(checkpoints, request.template)
    if snapshot is None:
        spec = SandboxSpec.model_validate(request.model_dump(exclude={"name", "snapshot_id", "template"}))
        return Boot(spec, images.get(spec.image).key)
    try:
        checkpoint = checkpoints.get(snapshot)
    except NotFound:
        if pull is None:
            raise
        await pull(snapshot)
        checkpoint = checkpoints.get(snapshot)
    return Restore(checkpoint, spec_from_checkpoint(checkpoint, request))


def template_checkpoint(checkpoints: CheckpointsRead, template: str) -> str:
    """The checkpoint a warm template keeps (see :class:`stasis.Template`): ``template-NAME``."""
    try:
        return checkpoints.get(TEMPLATE_PREFIX + template).id
    except CheckpointNotFound:
        prefix = TEMPLATE_PREFIX
        names = [c.name.removeprefix(prefix) for c in checkpoints.list() if (c.name or "").startswith(prefix)]
        raise NotFound(
            f"no template named {template[:80]!r}"
            + (f"; templates: {', '.join(sorted(names))}" if names else "")
            + "; make one with `stasis template create`"
        ) from None


def spec_from_checkpoint(checkpoint: CheckpointInfo, request: CreateSandboxRequest) -> SandboxSpec:
    """The checkpoint's resources; a MEMORY restore must keep its memory size and backend."""
    if "backend" in request.model_fields_set and request.backend != checkpoint.backend:
        raise InvalidRequest(
            f"checkpoint {checkpoint.id} was made on backend {checkpoint.backend!r}, not {request.backend!r}"
        )
    overrides = {
        k: getattr(request, k)
        for k in request.model_fields_set & {"timeout_secs", "on_idle", "lifetime_secs", "cpus", "network"}
    }
    overrides["backend"] = checkpoint.backend
    kept = checkpoint.spec
    overrides["lifetime_secs"] = request.lifetime_secs  # a lifetime is the request's, never a checkpoint's
    if kept.lifetime_secs is not None:  # taken of an E2B sandbox: its idle policy was E2B's, not this request's
        overrides.setdefault("timeout_secs", request.timeout_secs)
        overrides.setdefault("on_idle", request.on_idle)
    if request.secrets or request.egress_headers:  # a secret it had keeps its placeholder (its memory holds it)
        if overrides.get("network", kept.network) is None:
            raise InvalidRequest("secrets reach their hosts through the egress proxy: give the sandbox a network")
        overrides |= {"secrets": {**request.secrets, **kept.secrets},
                      "ca_lineage": kept.ca_lineage or request.ca_lineage,
                      "egress_headers": request.egress_headers or kept.egress_headers}  # fmt: skip
    if checkpoint.type == CheckpointType.FILESYSTEM:  # a boot: what it mounts and its size may change
        changeable = {"memory_mb", "disk_mb", "storage", "volumes"}
        overrides |= {k: getattr(request, k) for k in request.model_fields_set & changeable}
    else:
        for field, what in (("memory_mb", "memory"), ("disk_mb", "disk")):
            taken = getattr(checkpoint.spec, field)
            if field in request.model_fields_set and getattr(request, field) != taken:
                raise InvalidRequest(f"a MEMORY checkpoint restores with the {what} it was taken with ({taken} MiB)")
        if "volumes" in request.model_fields_set and request.volumes != checkpoint.spec.volumes:
            mounted = ", ".join(f"{m.name} at {m.path}" for m in checkpoint.spec.volumes) or "no volume"
            raise InvalidRequest(f"a MEMORY checkpoint restores with the volumes it was taken with ({mounted})")
        if "storage" in request.model_fields_set and request.storage != checkpoint.spec.storage:
            raise InvalidRequest(
                f"checkpoint {checkpoint.id} holds a kernel with {checkpoint.spec.storage} storage; a MEMORY restore "
                "keeps it: restore a FILESYSTEM checkpoint to change the storage"
            )
        if "network" in request.model_fields_set and (request.network is None) != (checkpoint.spec.network is None):
            had = "a network device" if checkpoint.spec.network else "no network device"
            raise InvalidRequest(
                f"checkpoint {checkpoint.id} holds a kernel with {had}; a MEMORY restore keeps that (its policy may "
                "change): restore a FILESYSTEM checkpoint to add or remove the network"
            )
    return checkpoint.spec.model_copy(update=overrides)
