"""Wire models of volumes: named directory trees with their own lifecycle, mounted into sandboxes."""

from __future__ import annotations

import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .validation import validate_name

# Where a volume may not be mounted: the sandbox's own mounts (the agent's, its kernel's file systems, /tmp on its disk)
VOLUMES_ON_GVISOR = (
    "volumes mount in gVisor sandboxes only, for now: a microVM would reach host files over 9p or virtiofs, and this "
    "QEMU cannot suspend a guest with either mounted; use backend 'gvisor' for a sandbox with volumes"
)
RESERVED_PATHS = ("/proc", "/sys", "/dev", "/tmp", "/opt/stasis", "/opt/stasis-python", "/opt/stasis-image",
                  "/etc/resolv.conf", "/etc/stasis", "/var/lib/stasis", "/usr", "/bin", "/sbin", "/lib", "/lib64",
                  "/etc/sudoers", "/etc/sudoers.d", "/etc/passwd", "/etc/shadow", "/etc/group")  # fmt: skip
SYSTEM_DIRS = ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/var", "/opt", "/home", "/root")  # not whole


class VolumeMount(BaseModel):
    """A volume at ``path`` in a sandbox (gVisor): every sandbox mounting it sees the same files."""

    model_config = ConfigDict(extra="forbid")
    name: str
    path: str = Field(max_length=1024)
    read_only: bool = False

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_name(name, "volume")

    @field_validator("path")
    @classmethod
    def _valid_path(cls, path: str) -> str:
        normal = posixpath.normpath(path)
        if not path.startswith("/") or normal == "/" or "\0" in path or normal.startswith("//"):
            raise ValueError(f"a volume's mount path must be an absolute directory other than /, not {path[:80]!r}")
        if any(normal == r or normal.startswith(r + "/") for r in RESERVED_PATHS) or normal in SYSTEM_DIRS:
            raise ValueError(f"{normal[:80]!r} holds the sandbox's own files; mount the volume in a folder of its own")
        return normal


def as_mounts(volumes: Any) -> Any:
    """``{"/data": "name"}`` or ``{"/data": {"name": ..., "read_only": True}}`` as the list of mounts."""
    if not isinstance(volumes, dict):
        return volumes
    return [{"path": path, **({"name": v} if isinstance(v, str) else v)} for path, v in volumes.items()]


def distinct_mounts(mounts: list[VolumeMount]) -> list[VolumeMount]:
    paths = [m.path for m in mounts]
    for path in paths:
        if any(other != path and other.startswith(path + "/") for other in paths) or paths.count(path) > 1:
            raise ValueError(f"volumes are mounted at {path!r} and inside it; give each its own directory")
    return mounts


class VolumeInfo(BaseModel):
    name: str
    created_at: float
    from_snapshot: str | None = None  # the snapshot it was forked from
    incarnation: str = Field("", description="random, per volume made: a token for a removed volume of the same "
                             "name never opens a new one")  # fmt: skip
    size_bytes: int = 0
    max_size_mb: int | None = Field(None, description="its size limit (btrfs store): past it, writes fail (EDQUOT)")
    mounted_by: list[str] = Field(default_factory=list, description="sandboxes (not ended) whose spec mounts it")
    store: str = Field("", description="btrfs (snapshots copy nothing, size limits) or copy (plain directories)")
    team: str | None = Field(None, description="its team (made with a team's key); None: the daemon owner's")


class VolumeSnapshotInfo(BaseModel):
    id: str
    volume: str
    name: str | None = None
    created_at: float
    size_bytes: int = 0
    max_size_mb: int | None = Field(None, description="its volume's size limit then: a fork keeps it")
    team: str | None = None  # its volume's


MAX_SIZE_MB = Field(None, ge=1, le=1 << 30, description="a size limit in MiB (needs the btrfs volume store)")


class CreateVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    from_snapshot: str | None = Field(None, max_length=128, description="a writable fork of this snapshot (id or name)")
    max_size_mb: int | None = MAX_SIZE_MB

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_name(name, "volume")


class UpdateVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_size_mb: int | None = MAX_SIZE_MB


class SnapshotVolumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str | None) -> str | None:
        return None if name is None else validate_name(name, "snapshot")
