"""What a sandbox restored from a checkpoint may change: a cold boot anything, a MEMORY restore not its size."""

from __future__ import annotations

import pytest

from stasis.daemon.core.sources import spec_from_checkpoint
from stasis.errors import InvalidRequest
from stasis.models import CheckpointInfo, CheckpointType, CreateSandboxRequest, SandboxSpec
from stasis.pool_models import CreatePoolRequest

pytestmark = pytest.mark.fast


def checkpoint(kind: CheckpointType) -> CheckpointInfo:
    spec = SandboxSpec(memory_mb=512, disk_mb=2048)
    return CheckpointInfo(
        id="ck-1", name=None, type=kind, sandbox_id="sb-1", sandbox_name="a", image="default-x", spec=spec,
        backend=spec.backend, runtime={}, created_at=0.0, expires_at=None, sha256=None, size_bytes=0, metadata={},
    )  # fmt: skip


def test_a_restore_keeps_the_checkpoints_sizes_unless_asked() -> None:
    for kind in CheckpointType:
        spec = spec_from_checkpoint(checkpoint(kind), CreateSandboxRequest(snapshot_id="ck-1"))
        assert (spec.memory_mb, spec.disk_mb) == (512, 2048)


def test_a_cold_boot_may_get_more_memory_and_disk() -> None:
    request = CreateSandboxRequest(snapshot_id="ck-1", memory_mb=1024, disk_mb=4096)
    spec = spec_from_checkpoint(checkpoint(CheckpointType.FILESYSTEM), request)
    assert (spec.memory_mb, spec.disk_mb) == (1024, 4096)


@pytest.mark.parametrize(("field", "what"), [("memory_mb", "memory"), ("disk_mb", "disk")])
def test_a_memory_restore_refuses_another_size_and_says_which(field: str, what: str) -> None:
    request = CreateSandboxRequest.model_validate({"snapshot_id": "ck-1", field: 4096})
    with pytest.raises(InvalidRequest, match=f"restores with the {what} it was taken with"):
        spec_from_checkpoint(checkpoint(CheckpointType.MEMORY), request)


def test_a_disk_smaller_than_the_smallest_useful_is_refused() -> None:
    with pytest.raises(ValueError, match="disk_mb"):
        SandboxSpec(disk_mb=64)


def test_volumes_are_a_memory_restores_own_and_a_cold_boots_choice() -> None:
    mounted = CreateSandboxRequest(snapshot_id="ck-1", volumes={"/data": "other"})
    with pytest.raises(InvalidRequest, match="restores with the volumes it was taken with"):
        spec_from_checkpoint(checkpoint(CheckpointType.MEMORY), mounted)
    assert spec_from_checkpoint(checkpoint(CheckpointType.FILESYSTEM), mounted).volumes[0].name == "other"
    pool = CreatePoolRequest(name="warm")  # a pool's members were started without volumes: never handed out for one
    assert pool.matches(CreateSandboxRequest()) and not pool.matches(CreateSandboxRequest(volumes={"/data": "v"}))
