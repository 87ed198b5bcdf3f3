"""A secret as the API takes it (its value, where it may go) and as anyone may read it (everything but that)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator, model_validator

from ..models import Strict
from ..secretnames import validate_egress_headers, validate_secret_hosts, validate_secret_value


class SecretRequest(Strict):
    """A secret's value and where it may go: ``PUT /v1/secrets/{name}`` (a new one, or a rotation)."""

    value: str = Field(repr=False, description="never returned by any read, never logged")
    hosts: list[str] = Field(
        default_factory=list, description="hostnames (api.example.com) or wildcards (*.example.com) it is bound to"
    )
    header: str | None = Field(None, description="set this header on every request to a bound host")
    format: str = Field("{value}", description="the header's value, {value} standing for the secret")
    body: bool = Field(False, description="replace the placeholder in request bodies too, not only in headers")
    metadata: dict[str, str] = Field(default_factory=dict, description="the owner's notes (E2B's metadata)")

    _valid_value = field_validator("value")(classmethod(lambda cls, v: validate_secret_value(v)))
    _valid_hosts = field_validator("hosts")(classmethod(lambda cls, v: validate_secret_hosts(v)))

    @model_validator(mode="after")
    def _valid_header(self) -> SecretRequest:
        if self.header is not None:
            validate_egress_headers({"example.com": {self.header: self.format}})
        if "{value}" not in self.format:
            raise ValueError("format must contain {value} (where the secret goes), e.g. 'Bearer {value}'")
        return self


class SecretInfo(BaseModel):
    """What anyone may read of a secret: everything but its value."""

    name: str
    hosts: list[str]
    header: str | None = None
    format: str = "{value}"
    body: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)
    version: int = Field(description="1 when added; each rotation adds one")
    created_at: float
    updated_at: float
