"""The wire model of `stasis e2b serve`: what opens E2B's face on a listener."""

from __future__ import annotations

from pydantic import Field, field_validator

from .backends import BACKENDS, DEFAULT_BACKEND
from .models import Strict
from .validation import validate_backend


class E2bServeRequest(Strict):
    """Open the E2B face on a TCP listener for as long as the request's stream stays open (`stasis e2b serve`)."""

    listen: str = Field("127.0.0.1:3000", max_length=300, description="HOST:PORT (port 0: any free port)")
    backend: str = Field(DEFAULT_BACKEND, json_schema_extra={"enum": list(BACKENDS)})
    memory_mb: int = Field(1024, ge=128, le=262144, description="each sandbox's memory (E2B's templates carry none)")
    cpus: float = Field(1.0, ge=0.01, le=64)
    domain: str | None = Field(None, max_length=253, description="route Host PORT-ID.DOMAIN too (a wildcard DNS name)")
    build_network: bool = Field(False, description="template builds' steps reach the network (apt, pip, git)")

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        return validate_backend(backend)
