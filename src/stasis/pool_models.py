"""Wire models of warm pools: sandboxes of one spec started ahead, claimed by a matching create."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from .backends import BACKENDS, DEFAULT_BACKEND
from .models import CreateSandboxRequest, Strict
from .validation import validate_backend, validate_name

POOL_MAX_SIZE = 64


class CreatePoolRequest(Strict):
    """Sandboxes of one spec started ahead; a matching create claims one instead of booting."""

    name: str
    size: int = Field(2, ge=1, le=POOL_MAX_SIZE, description="sandboxes kept started and waiting")
    image: str = "default"
    backend: str = Field(DEFAULT_BACKEND, json_schema_extra={"enum": list(BACKENDS)})
    cpus: float = Field(1.0, ge=0.01, le=64)
    memory_mb: int = Field(1024, ge=128, le=262144)
    disk_mb: int = Field(10240, ge=512, le=1 << 20)
    storage: Literal["durable", "fast"] = "durable"
    template: str | None = Field(None, description="members are restored from this template, not booted")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_name(name)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        return validate_backend(backend)

    def member_request(self) -> CreateSandboxRequest:
        """What a member is created with. It never idles out: it is suspended or removed only once claimed.
        A template's members take the template's resources except those the pool names."""
        if self.template is None:
            fields = self.model_dump(include=set(RESOURCES) | {"image"})
        else:
            fields = self.model_dump(include=self.model_fields_set & set(RESOURCES))
        return CreateSandboxRequest(**fields, template=self.template, timeout_secs=None)

    def matches(self, request: CreateSandboxRequest) -> bool:
        """Whether a create asks for what this pool's members are (its name and idle policy may differ).
        From an image: the same image and resources. From a template: the same template, and the same value
        of every resource that either names (the others are the template's)."""
        if request.snapshot_id is not None or request.network is not None or request.template != self.template:
            return False
        if request.volumes:  # a member was started without them
            return False
        if self.template is None:
            return request.image == self.image and all(getattr(request, f) == getattr(self, f) for f in RESOURCES)
        named = (request.model_fields_set | self.model_fields_set) & set(RESOURCES)
        both = request.model_fields_set & self.model_fields_set
        return named <= both and all(getattr(request, f) == getattr(self, f) for f in named)


RESOURCES = ("backend", "cpus", "memory_mb", "disk_mb", "storage")


class PoolInfo(BaseModel):
    name: str
    spec: CreatePoolRequest
    ready: int = Field(description="members started and waiting to be claimed")
    starting: int = Field(description="members being started to refill it")
    claimed: int = Field(0, description="members handed out since the daemon started")
    last_error: str | None = Field(None, description="why the last refill failed, if it did")
    members: list[str] = Field(default_factory=list, description="ids of the sandboxes waiting in it")
