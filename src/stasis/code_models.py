"""Wire models of the code interpreter (``run_code``): shared by the daemon's code room and the SDK."""

from __future__ import annotations

from pydantic import Field, field_validator

from .models import MAX_SECONDS, Strict
from .validation import validate_env, validate_path


class CodeRequest(Strict):
    """One execution in a Jupyter kernel of the sandbox (``run_code``)."""

    code: str = Field(max_length=16 << 20)
    language: str | None = Field(None, max_length=32, description="python (the default) or bash; not with context_id")
    context_id: str | None = Field(None, max_length=64)
    env_vars: dict[str, str] | None = None
    timeout: float | None = Field(None, gt=0, le=MAX_SECONDS, description="seconds; then the kernel is interrupted")

    _valid_env = field_validator("env_vars")(classmethod(lambda cls, v: v if v is None else validate_env(v)))


class CodeContextRequest(Strict):
    language: str | None = Field(None, max_length=32)
    cwd: str | None = None

    _valid_cwd = field_validator("cwd")(classmethod(lambda cls, v: validate_path(v)))
