"""A manifest: what the remote store holds of one sandbox or checkpoint, written last. Read as untrusted
input: a document that does not parse as one is refused, never half-used."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import CheckpointCorrupt

ManifestT = TypeVar("ManifestT", bound=BaseModel)
FORMAT = 2  # 2: what files depend on outside their directory is a list of externals (1: a microVM's "base")


class ImageRef(BaseModel):
    ref: str  # the name it was built or imported under
    key: str  # the exact build


class Manifest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: int
    kind: Literal["sandbox", "checkpoint"]
    id: str
    name: str | None = None
    backend: str
    runtime: dict[str, Any] = Field(default_factory=dict)
    image: ImageRef
    record: dict[str, Any]  # the SandboxInfo or CheckpointInfo, as the node that pushed it had it
    files: dict[str, Any]  # the pieces that rebuild its directory (see remote.chunks)
    externals: list[str] = Field(default_factory=list)
    pushed_by: str = ""
    pushed_at: float = 0.0
    # a sandbox's: who owns it now (None: waiting in the store), how often it changed hands
    owner: str | None = None
    generation: int = 0
    push_id: str | None = None
    taken_at: float | None = None
    volumes: dict[str, str] = Field(default_factory=dict)  # a sandbox's: each volume it mounts, its incarnation

    @classmethod
    def parse(cls, document: dict[str, Any], where: str) -> Manifest:
        return _parse(cls, document, where, "manifest")

    def document(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


class VolumeManifest(BaseModel):
    """A volume's files as one node pushed them (the newest push of a name wins): a copy, not an owner."""

    model_config = ConfigDict(extra="ignore")

    format: int
    kind: Literal["volume"]
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    max_size_mb: int | None = Field(None, ge=1, le=1 << 30)
    incarnation: str = Field("", pattern=r"^[0-9a-f]{0,32}$")
    team: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    files: dict[str, Any]
    pushed_by: str = ""
    pushed_at: float = 0.0

    @classmethod
    def parse(cls, document: dict[str, Any], where: str) -> VolumeManifest:
        manifest = _parse(cls, document, where, "volume manifest")
        if ".." in manifest.name:
            raise CheckpointCorrupt(f"{where} names volume {manifest.name[:80]!r}, which is no volume's name; refused")
        return manifest


def _parse(cls: type[ManifestT], document: dict[str, Any], where: str, what: str) -> ManifestT:
    """The store's word, checked as any input: a document that does not parse, or of another format, is refused."""
    try:
        manifest = cls.model_validate(document)
    except ValidationError as exc:
        raise CheckpointCorrupt(f"{where} is not a {what} stasis can read: {str(exc)[:300]}") from None
    if manifest.format != FORMAT:  # type: ignore[attr-defined]
        raise CheckpointCorrupt(
            f"{where} was written in format {manifest.format} (this stasis reads {FORMAT}); push it again "  # type: ignore[attr-defined]
            "from a node that has it"
        )
    return manifest
