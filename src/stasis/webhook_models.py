"""Wire models of webhooks: lifecycle events of sandboxes, posted (signed) to a URL, at least once."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .validation import validate_name

EVENT_TYPES = ("created", "forked", "resumed", "suspended", "checkpointed", "updated", "moved", "killed", "failed")


class CreateWebhookRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=2048, description="http:// or https://; a public address unless allow_private")
    events: list[str] = Field(default_factory=lambda: list(EVENT_TYPES), max_length=len(EVENT_TYPES))
    team: str | None = Field(None, description="only this team's sandboxes' events; None: every sandbox's")
    allow_private: bool = Field(False, description="may reach private, loopback and link-local addresses")
    description: str = Field("", max_length=200)
    flavor: Literal["stasis", "e2b"] = Field("stasis", description="e2b: E2B's payload and e2b-signature header")
    name: str = Field("", max_length=200)
    enabled: bool = True
    secret: str | None = Field(None, min_length=8, max_length=200, description="None: one is made (and shown once)")

    @field_validator("events")
    @classmethod
    def _known(cls, events: list[str]) -> list[str]:
        unknown = sorted(set(events) - set(EVENT_TYPES))
        if unknown or not events:
            raise ValueError(f"unknown event {', '.join(unknown) or '(none given)'}: use {', '.join(EVENT_TYPES)}")
        return [e for e in EVENT_TYPES if e in events]

    @field_validator("team")
    @classmethod
    def _team(cls, team: str | None) -> str | None:
        return None if team is None else validate_name(team, "team")


class WebhookInfo(BaseModel):
    id: str
    url: str
    events: list[str]
    team: str | None = None
    allow_private: bool = False
    created_at: float
    description: str = ""
    flavor: Literal["stasis", "e2b"] = "stasis"
    name: str = ""
    enabled: bool = True


class CreatedWebhook(WebhookInfo):
    secret: str = Field(description="signs each delivery (Stasis-Signature): shown this once")


class DeliveryInfo(BaseModel):
    id: str
    webhook_id: str
    event_id: str
    event_type: str
    sandbox_id: str
    status: str = Field(description="pending, delivered, or failed (gave up after its attempts)")
    attempts: int
    next_at: float | None = None
    delivered_at: float | None = None
    last_status: int | None = Field(None, description="the receiver's HTTP status on the last attempt")
    last_error: str | None = None
    last_duration_ms: float | None = None


class AttemptInfo(BaseModel):
    at: float
    status_code: int | None
    duration_ms: float
    error: str | None = None
