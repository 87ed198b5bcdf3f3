"""Wire models of the HTTP API, shared by the daemon and the SDK."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .backends import BACKENDS, DEFAULT_BACKEND
from .errors import InvalidRequest
from .netpolicy import NetworkPolicy, as_policy
from .secretnames import sandbox_lineage, validate_egress_headers, validate_sandbox_secrets
from .validation import (
    EXEC_ID_PATTERN,
    NAME_PATTERN,
    all_utf8,
    describe_validation_errors,
    validate_backend,
    validate_command,
    validate_env,
    validate_name,
    validate_path,
    validate_user,
)  # fmt: skip
from .volume_models import VOLUMES_ON_GVISOR, VolumeMount, as_mounts, distinct_mounts

ModelT = TypeVar("ModelT", bound=BaseModel)
MAX_SECONDS = 365 * 24 * 3600  # the longest time a request may name (a timeout, a TTL): a year; longer is never (None)


def build(model: type[ModelT], **fields: Any) -> ModelT:
    """Validate client-side, raising the same InvalidRequest the daemon would send."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise InvalidRequest(describe_validation_errors(exc.errors())) from None


class SandboxStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SNAPSHOTTING = "snapshotting"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED = "failed"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_lone_surrogates(cls, data: Any) -> Any:
        if not all_utf8(data):
            raise ValueError("a string in the request is not valid UTF-8 (it has a lone surrogate, such as \\ud800)")
        return data


class SandboxSpec(Strict):
    image: str = "default"
    backend: str = Field(DEFAULT_BACKEND, json_schema_extra={"enum": list(BACKENDS)})
    cpus: float = Field(1.0, ge=0.01, le=64, description="CPU cores; at least 0.01 (the kernel's smallest CPU quota)")
    memory_mb: int = Field(1024, ge=128, le=262144)
    disk_mb: int = Field(
        10240, ge=512, le=1 << 20, description="size of the sandbox's root file system (and /tmp) in MiB"
    )
    network: NetworkPolicy | None = Field(
        None, description="None: no network device at all; a policy: where it may connect (true: the internet)"
    )
    timeout_secs: int | None = Field(600, ge=1, description="idle time before the idle action; None: never")
    on_idle: Literal["suspend", "terminate"] | None = None
    keep_memory: bool = Field(
        True, description="a suspend keeps its memory and processes (resumed where it was); false: its files only "
        "(the next resume boots it again with them: E2B's filesystem-only pause); fast storage always keeps memory",
    )  # fmt: skip
    lifetime_secs: int | None = Field(
        None, ge=0, le=MAX_SECONDS,
        description="how long it runs from its start (and from each resume) before its idle action, used or not "
        "(E2B's timeout); None: no limit",
    )  # fmt: skip
    secrets: Annotated[dict[str, str], BeforeValidator(validate_sandbox_secrets)] = Field(
        default_factory=dict,
        description="the daemon's secrets this sandbox uses, as name -> the placeholder its environment variable "
        "holds (at create, a list of names: each gets a fresh placeholder); the egress proxy puts the real value in",
    )
    egress_headers: Annotated[dict[str, dict[str, str]], AfterValidator(validate_egress_headers)] = Field(
        default_factory=dict,
        description="per host: headers the egress proxy sets on each HTTPS request, ${secrets.NAME} in a value "
        "standing for that secret's current value (E2B's network rules)",
    )
    ca_lineage: str | None = Field(
        None, description="the CA the egress proxy signs with for this sandbox's secrets (forks keep it)"
    )
    screen: str | None = Field(
        None, pattern=r"^[1-9][0-9]{2,3}x[1-9][0-9]{2,3}$", description="a desktop's screen, WIDTHxHEIGHT (1280x800)"
    )
    storage: Literal["durable", "fast"] = Field(
        "durable",
        description="durable: its files on the host (an fsync reaches the disk, a sandbox killed on the host keeps "
        "them); fast (gVisor): its writable layer in the sandbox's kernel, 2x faster small-file work, kept by "
        "suspends and checkpoints but lost if the sandbox is killed on the host (see the README)",
    )
    volumes: Annotated[list[VolumeMount], BeforeValidator(as_mounts), AfterValidator(distinct_mounts)] = Field(
        default_factory=list, max_length=16, description="volumes mounted in it (gVisor); their files are not its own"
    )
    desktop_session: bool = Field(
        True,
        description="the desktop image: stasis starts its session (X, a window manager, Chromium, VNC) at boot; "
        "false: the client starts its own, as E2B Desktop's SDK does",
    )
    team: str | None = Field(None, max_length=63, description="its team (a team key's creates are its team's)")

    @field_validator("network", mode="before")
    @classmethod
    def _network(cls, network: Any) -> NetworkPolicy | None:
        return as_policy(network)

    @model_validator(mode="after")
    def _secrets_need_the_proxy(self) -> SandboxSpec:
        uses_secrets = bool(self.secrets or self.egress_headers)
        lineage = sandbox_lineage(uses_secrets, self.network is not None, self.ca_lineage)
        if lineage != self.ca_lineage:  # assigned only when made: a field set counts as sent
            self.ca_lineage = lineage
        return self

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        return validate_backend(backend)

    @model_validator(mode="after")
    def _fast_storage_is_gvisors(self) -> SandboxSpec:
        if self.storage == "fast" and self.backend != "gvisor":
            raise ValueError(
                f"storage 'fast' keeps the writable layer in gVisor's kernel; backend {self.backend!r} has its own "
                "disk: leave storage 'durable' (the default), or use backend 'gvisor'"
            )
        if self.volumes and self.backend != "gvisor":
            raise ValueError(VOLUMES_ON_GVISOR)
        return self


TEMPLATE_PREFIX = "template-"  # a template NAME is the MEMORY checkpoint named template-NAME (stasis.Template)


class CreateSandboxRequest(SandboxSpec):
    timeout_secs: int | None = Field(600, ge=1, le=MAX_SECONDS)  # the spec's, bounded here: a stored spec still reads
    name: str | None = None
    snapshot_id: str | None = Field(None, description="create from this checkpoint (id or name)")
    template: str | None = Field(None, description="create from this template: its start command already running")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str | None) -> str | None:
        return None if name is None else validate_name(name)


class SandboxInfo(BaseModel):
    id: str
    name: str | None
    status: SandboxStatus
    spec: SandboxSpec
    created_at: float
    updated_at: float
    last_activity: float
    error: str | None = None
    image_key: str | None = Field(None, description="the exact image build it runs on")
    from_checkpoint: str | None = Field(None, description="the checkpoint it was created from")
    runtime: dict[str, Any] = Field(default_factory=dict, description="what its backend reports (build, platform)")
    last_suspend_seconds: float | None = None
    last_resume_seconds: float | None = None
    idle_action: Literal["suspend", "terminate"] | None = None
    idle_action_at: float | None = Field(
        None,
        description="when the idle action runs unless it is used (or at its deadline, used or not); None while in "
        "use (a request, a session, a live view) or without a timeout or deadline",
    )
    from_pool: str | None = Field(None, description="the warm pool it was claimed from")
    pool: str | None = Field(None, description="the pool it waits in (a member not claimed yet)")
    forked_from: str | None = Field(None, description="the sandbox it is a live fork of")
    moved_to: str | None = Field(None, description="the remote store it was handed to (it left this node)")
    node: str | None = Field(None, description="the fleet's node it is on (set by a fleet's front door)")
    deadline: float | None = Field(
        None,
        description="when its lifetime ends: its idle action runs then, used or not (E2B's timeout); each resume "
        "starts a new lifetime_secs; None: it lives until idle or removed",
    )


class RunRequest(Strict):
    cmd: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout: float | None = Field(None, gt=0, le=MAX_SECONDS, description="seconds; None: no limit")
    max_output: int = Field(1 << 20, ge=1, le=64 << 20)
    exec_id: str | None = Field(None, description="idempotency key: a known id reattaches to that run")
    stdin_b64: str | None = None
    user: str | None = Field(None, description="run as this user of the sandbox (name, uid, name:group); default: "
                             "the image's User, else root")  # fmt: skip

    @field_validator("exec_id")
    @classmethod
    def _valid_exec_id(cls, exec_id: str | None) -> str | None:
        if exec_id is not None and not EXEC_ID_PATTERN.fullmatch(exec_id):
            raise ValueError("exec_id must be 1-128 letters, digits, '.', '_', ':' or '-'")
        return exec_id

    _valid_cmd = field_validator("cmd")(classmethod(lambda cls, v: validate_command(v)))
    _valid_env = field_validator("env")(classmethod(lambda cls, v: validate_env(v)))
    _valid_cwd = field_validator("cwd")(classmethod(lambda cls, v: validate_path(v)))
    _valid_user = field_validator("user")(classmethod(lambda cls, v: validate_user(v)))


class RunResult(BaseModel):
    exec_id: str
    exit_code: int
    stdout_b64: str
    stderr_b64: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration: float
    limit: str | None = Field(None, description="a sandbox limit the command ran into (processes, memory)")


class StartProcessRequest(Strict):
    cmd: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    name: str | None = None
    stdin: bool = False
    user: str | None = Field(None, description="as for a run")

    _valid_cmd = field_validator("cmd")(classmethod(lambda cls, v: validate_command(v)))
    _valid_env = field_validator("env")(classmethod(lambda cls, v: validate_env(v)))
    _valid_cwd = field_validator("cwd")(classmethod(lambda cls, v: validate_path(v)))
    _valid_user = field_validator("user")(classmethod(lambda cls, v: validate_user(v)))


class ProcessInfo(BaseModel):
    id: str
    pid: int
    name: str | None
    cmd: list[str]
    status: Literal["running", "exited"]
    exit_code: int | None
    started_at: float
    finished_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    limit: str | None = None


class SshHostKey(BaseModel):
    public_key: str = Field(description="the sandbox's SSH host key, one OpenSSH public key line")


class SshKeysRequest(Strict):
    public_keys: list[str] = Field(min_length=1, max_length=64, description="OpenSSH public key lines to authorise")


class ProcessOutput(BaseModel):
    data_b64: str
    offset: int
    next_offset: int
    lost: int
    eof: bool
    exit_code: int | None


class SignalRequest(Strict):
    signal: str = "SIGTERM"


class StdinRequest(Strict):
    data_b64: str = ""
    close: bool = False


class FileEntry(BaseModel):
    name: str
    path: str
    type: Literal["file", "directory", "symlink", "other"]
    size: int
    mode: int
    mtime: float


class DaemonInfo(BaseModel):
    version: str
    pid: int
    home: str
    backends: dict[str, dict[str, Any]]


class CheckpointType(StrEnum):
    MEMORY = "memory"  # memory, running processes and files: restores warm
    FILESYSTEM = "filesystem"  # files only: restores with a fresh boot


class CreateCheckpointRequest(Strict):
    type: CheckpointType = CheckpointType.MEMORY
    name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    ttl_secs: int | None = Field(None, ge=1, le=MAX_SECONDS, description="delete after this long; None: keep forever")
    include_volumes: bool = Field(False, description="keep a snapshot of each mounted volume: a restore forks them")

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str | None) -> str | None:
        if name is not None and (not NAME_PATTERN.fullmatch(name) or re.fullmatch(r"ck-[0-9a-z]{12}", name)):
            raise ValueError(f"invalid checkpoint name {name[:80]!r}: use 1-63 letters, digits, '.', '_' or '-' "
                             "(not in the form of a checkpoint id)")  # fmt: skip
        return name


class CheckpointInfo(BaseModel):
    id: str
    name: str | None
    type: CheckpointType
    sandbox_id: str
    sandbox_name: str | None
    image: str
    spec: SandboxSpec
    backend: str
    runtime: dict[str, Any] = Field(validation_alias=AliasChoices("runtime", "backend_state"))
    created_at: float
    expires_at: float | None
    sha256: str | None
    size_bytes: int
    metadata: dict[str, Any]
    volume_snapshots: dict[str, str] = Field(default_factory=dict, description="volume -> its snapshot, if included")


class RemoteRequest(Strict):
    ref: str = Field(min_length=1, max_length=200, description="a sandbox's, checkpoint's or volume's name or id")
    kind: Literal["sandbox", "checkpoint", "volume"] | None = Field(None, description="which (a volume: always said)")


class TransferResult(BaseModel):
    """What a push to or a pull from the remote store did."""

    kind: Literal["sandbox", "checkpoint", "volume"]
    id: str
    name: str | None
    url: str = Field(description="its manifest in the remote store")
    chunks: int = Field(description="distinct non-zero pieces the artifact is made of")
    bytes: int = Field(description="their size, uncompressed")
    moved_chunks: int = Field(description="pieces sent (push) or fetched from the store (pull): the rest were there")
    moved_bytes: int = Field(description="bytes on the wire, compressed")
    seconds: float
    owner: str | None = Field(None, description="for a sandbox: the node that owns it now (None: the store)")


class RemoteEntry(BaseModel):
    """A sandbox, checkpoint or volume in the remote store."""

    kind: Literal["sandbox", "checkpoint", "volume"]
    id: str
    name: str | None
    backend: str
    image: str
    owner: str | None = Field(None, description="a sandbox's node; None while it waits in the store")
    generation: int | None = Field(None, description="how many times a sandbox changed hands")
    pushed_by: str
    pushed_at: float
    sandbox: SandboxInfo | None = Field(
        None, description="a sandbox's record as it left its node (`ls` through a fleet)"
    )


class ForkRequest(Strict):
    times: int = Field(1, ge=1, le=64)


class RemoveRequest(Strict):
    """Several sandboxes removed in one call (a rollout's forks)."""

    refs: list[str] = Field(min_length=1, max_length=1024, description="names or ids")


class RemoveResult(BaseModel):
    removed: list[str] = Field(description="ids of the sandboxes removed (or gone already)")
    failed: dict[str, str] = Field(default_factory=dict, description="each ref not removed, and why")


class DiskUsage(BaseModel):
    sandboxes_bytes: int
    checkpoints_bytes: int
    images_bytes: int
    remote_cache_bytes: int = 0
    remote_cache_chunks: int = 0
    remote_cache_limit_bytes: int = 0
    remote: str | None = None
    sandboxes: dict[str, int]
    checkpoints: dict[str, int]
    shared_note: str


class ExposePortRequest(Strict):
    port: int = Field(ge=1, le=65535, description="the TCP port a server in the sandbox listens on")
    public: bool = Field(False, description="no token needed: anyone who can reach the daemon's listener")
    ttl_secs: int = Field(86400, ge=60, le=365 * 86400, description="how long the URL's token is valid")


class ExposedPort(BaseModel):
    sandbox_id: str
    port: int
    url: str = Field(description="http URL on the daemon's listener; carries its token unless public")
    public: bool
    listen: str = Field(description="host:port the daemon listens on for this port")
    expires_at: float | None = Field(None, description="when the URL's token expires; None if public")


class BuildImageRequest(Strict):
    recipe: str = Field("default", max_length=63, description="a built-in recipe's name (`stasis image ls`)")
    force: bool = Field(False, description="build again even if this recipe's build exists")


class CommitImageRequest(Strict):
    """One build step's result as an image (see stasis.images.builder)."""

    parent: str = Field(description="key of the image the step ran on")
    checkpoint: str | None = Field(None, description="a FILESYSTEM checkpoint of the build sandbox after the "
                                   "step; None: the step changed only the image's config")  # fmt: skip
    name: str
    key: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
    config: dict[str, Any] = Field(default_factory=dict, description="the image config after the step")
    step: str = ""
