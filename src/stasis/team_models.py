"""Wire models of teams: tenants of one daemon, their keys (with scopes and an expiry) and their quotas."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .validation import validate_name

SCOPES = ("read", "write", "exec", "admin")
SCOPE_HELP = (
    "read: list and inspect; write: create, change and remove (and read); exec: run commands and touch files in "
    "sandboxes (and read); admin: all of these, and the team's keys"
)
MAX_SECONDS = 10 * 365 * 86400


def normalize_scopes(scopes: list[str]) -> list[str]:
    """``sandboxes:write`` or ``write``; each once, in SCOPES order. Unknown ones are refused."""
    wanted = {scope.strip().removeprefix("sandboxes:") for scope in scopes}
    unknown = sorted(wanted - set(SCOPES))
    if unknown or not wanted:
        named = ", ".join(unknown) or "(none given)"
        raise ValueError(f"unknown scope {named}: use {', '.join(SCOPES)} ({SCOPE_HELP})")
    return [scope for scope in SCOPES if scope in wanted]


class TeamQuotas(BaseModel):
    """What a team may use at once; None: no limit. Suspended sandboxes count toward disk, not the rest."""

    model_config = ConfigDict(extra="forbid")
    max_running: int | None = Field(None, ge=0, le=100_000, description="sandboxes running at once")
    max_cpus: float | None = Field(None, ge=0, le=100_000, description="CPUs of its running sandboxes together")
    max_memory_mb: int | None = Field(None, ge=0, le=1 << 30, description="memory of its running sandboxes together")
    max_disk_mb: int | None = Field(None, ge=0, le=1 << 40, description="disks of its sandboxes, suspended ones too")
    max_lifetime_secs: int | None = Field(None, ge=1, le=MAX_SECONDS, description="a sandbox's longest run: its "
                                          "lifetime is at most this (from each start or resume)")  # fmt: skip
    max_checkpoint_mb: int | None = Field(None, ge=0, le=1 << 40, description="what its checkpoints take, together")


class TeamInfo(BaseModel):
    name: str
    created_at: float
    quotas: TeamQuotas = Field(default_factory=TeamQuotas)


class CreateTeamRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    quotas: TeamQuotas = Field(default_factory=TeamQuotas)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_name(name, "team")


class KeyInfo(BaseModel):
    id: str
    team: str
    scopes: list[str]
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    last_used_at: float | None = None
    description: str = ""
    made_by: str | None = Field(
        None, description="the key that made it (None: the owner); revoking a key revokes every key it made, and theirs"
    )


class CreatedKey(KeyInfo):
    key: str = Field(description="the key itself: shown this once, only its hash is kept")


class ExportedKey(KeyInfo):
    """A key as a fleet's door copies it to a node that joined: its secret's hash, never the secret."""

    model_config = ConfigDict(extra="forbid")
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    id: str = Field(pattern=r"^[0-9a-z]{12}$")
    team: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    scopes: list[str] = Field(max_length=16)

    @field_validator("scopes")
    @classmethod
    def _valid_scopes(cls, scopes: list[str]) -> list[str]:
        return normalize_scopes(scopes)


class CreateKeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    team: str
    scopes: list[str] = Field(default_factory=lambda: ["read", "write", "exec"], max_length=16)
    expires_in_secs: int | None = Field(None, ge=1, le=MAX_SECONDS, description="None: never expires")
    description: str = Field("", max_length=200)
    key: str | None = Field(None, max_length=100, description="the owner's only: this very key (a fleet's door gives "
                            "every node the key one of them made)")  # fmt: skip
    made_by: str | None = Field(
        None,
        max_length=12,
        pattern=r"^[0-9a-z]{12}$",
        description="the owner's only, with key: the key that made it on the node where it was made",
    )

    @field_validator("team")
    @classmethod
    def _valid_team(cls, team: str) -> str:
        return validate_name(team, "team")

    @field_validator("scopes")
    @classmethod
    def _valid_scopes(cls, scopes: list[str]) -> list[str]:
        return normalize_scopes(scopes)


class SandboxUsage(BaseModel):
    """What one sandbox used in a window: what its processes burnt (CPU, network) and what it was allotted."""

    sandbox_id: str
    name: str | None = None
    team: str | None = None
    running_seconds: float = 0.0
    suspended_seconds: float = 0.0
    cpu_seconds: float = Field(0.0, description="CPU time its processes used on the host (measured)")
    cpu_allocated_seconds: float = Field(0.0, description="its CPUs times the seconds it ran (allocated)")
    memory_gib_seconds: float = Field(0.0, description="its memory (GiB) times the seconds it ran (allocated)")
    disk_gib_hours: float = Field(0.0, description="its disk size (GiB) times the hours it existed, suspended too")
    egress_bytes: int = Field(0, description="bytes it sent out through its egress proxy (measured)")
    ingress_bytes: int = Field(0, description="bytes that came back to it through its egress proxy (measured)")


class TeamUsage(BaseModel):
    team: str | None = Field(description="None: the daemon owner's own sandboxes")
    sandboxes: int = 0
    running_seconds: float = 0.0
    suspended_seconds: float = 0.0
    cpu_seconds: float = 0.0
    cpu_allocated_seconds: float = 0.0
    memory_gib_seconds: float = 0.0
    disk_gib_hours: float = 0.0
    egress_bytes: int = 0
    ingress_bytes: int = 0
    checkpoint_gib_hours: float = Field(0.0, description="its checkpoints kept now: size times hours kept")


class UsageReport(BaseModel):
    since: float
    until: float
    teams: list[TeamUsage]
    sandboxes: list[SandboxUsage]
