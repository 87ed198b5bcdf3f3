"""What ``Sandbox`` and ``AsyncSandbox`` share: results, options, and every request as a pure recipe.

A recipe (:class:`Call`) says which method and URL, what to send and how to read the
answer; the twins only carry it out, one with ``httpx.Client``, one with ``httpx.AsyncClient``
(httpx's BaseClient pattern). Nothing here does I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import httpx

from ..errors import InvalidRequest, StasisError
from ..models import (
    CheckpointInfo,
    CheckpointType,
    CreateCheckpointRequest,
    CreateSandboxRequest,
    ExposedPort,
    ExposePortRequest,
    FileEntry,
    ProcessInfo,
    ProcessOutput,
    RemoveResult,
    RunRequest,
    RunResult,
    SandboxInfo,
    SandboxStatus,
    SshHostKey,
    SshKeysRequest,
    StartProcessRequest,
    build,
)
from ..netpolicy import NetworkPolicy, as_policy
from ._results import Collector, CommandResult, OutputCallback, OutputEvent, stream_event

__all__ = ["Collector", "CommandResult", "OutputCallback", "OutputEvent", "stream_event"]

EXIT_CODE_TIMEOUT = 124  # what `timeout(1)` returns; used by the CLI
Command = str | list[str]
Args = list[str] | None


class CreateOptions(TypedDict, total=False):
    image: str
    cpus: float
    memory_mb: int
    disk_mb: int
    timeout_secs: int
    on_idle: str
    keep_memory: bool  # False: a suspend (idle, or asked) keeps its files only; the next resume boots it again
    lifetime_secs: int  # how long it runs from its start (and each resume), used or not, before on_idle
    node: str  # through a fleet's front door (STASIS_FLEET): the node it goes to, instead of where there is room
    backend: str
    network: bool | NetworkPolicy  # True: the internet; a policy: only where it allows; absent: no network
    snapshot_id: str  # create from this checkpoint (id or name): its processes and files
    template: str | None  # create from this template (stasis.Template): its start command already running
    secrets: list[str]  # the daemon's secrets it may use: each an env var holding a placeholder (stasis.Secret)
    screen: str  # a desktop's screen (image "desktop"), WIDTHxHEIGHT: 1280x800 unless said
    storage: str  # "durable" (default) or "fast" (gVisor: its files in its kernel; see the README's trade-offs)
    desktop_session: bool  # image "desktop": False to start no session at boot (the client starts its own X)
    volumes: dict[str, str | dict[str, Any]]  # path in the sandbox -> volume name (or {"name", "read_only"}); gVisor


class RunOptions(TypedDict, total=False):
    env: dict[str, str]
    working_dir: str
    timeout: float  # seconds; the command and its children are killed after it
    max_output: int  # bytes of stdout (and of stderr) kept, the last ones; the rest is marked truncated
    exec_id: str  # idempotency key: a known id reattaches to that run instead of starting it again
    stdin: bytes | str
    user: str  # a user of the sandbox (name, uid, name:group); default: the image's User, else root


class WatchedRunOptions(RunOptions, total=False):
    on_stdout: OutputCallback  # called with each chunk as the command writes it
    on_stderr: OutputCallback


class ProcessOptions(TypedDict, total=False):
    env: dict[str, str]
    working_dir: str
    name: str
    stdin: bool
    user: str


class CheckpointOptions(TypedDict, total=False):
    name: str
    metadata: dict[str, Any]
    ttl_secs: int
    include_volumes: bool  # a snapshot of each mounted volume: a restore or fork mounts new forks of them


def command_argv(command: Command, args: list[str] | None) -> list[str]:
    """``run("ls -la")`` goes through the shell; ``run("ls", ["-la"])`` and ``run(["ls", "-la"])`` do not."""
    if isinstance(command, list):
        return [*command, *(args or [])]
    if args is None:
        return ["/bin/sh", "-c", command]
    return [command, *args]


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _b64(data: bytes | str) -> str:
    return base64.b64encode(_bytes(data)).decode()


@dataclass(frozen=True)
class Call:
    """One request to the daemon and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], Any] = lambda response: None
    params: dict[str, Any] | None = None
    json: Any = None
    content: Any = None  # bytes, or an iterator of them (an upload streamed from a file)
    kwargs: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        sent = {"params": self.params, "json": self.json, "content": self.content}
        object.__setattr__(self, "kwargs", {k: v for k, v in sent.items() if v is not None})


def _model(model: Any) -> Callable[[httpx.Response], Any]:
    return lambda response: model.model_validate(response.json())


def _models(model: Any) -> Callable[[httpx.Response], Any]:
    return lambda response: [model.model_validate(item) for item in response.json()]


# ---------------------------------------------------------------- recipes that need no sandbox


def create_call(name: str | None, options: CreateOptions) -> Call:
    fields = {k: v for k, v in options.items() if v is not None}
    node = fields.pop("node", None)  # the front door's, not the daemon's
    body = build(CreateSandboxRequest, name=name, **fields).model_dump(exclude_unset=True)
    return Call("POST", "/v1/sandboxes", _model(SandboxInfo), json=body if node is None else {**body, "node": node})


def connect_call(id_or_name: str) -> Call:
    return Call("GET", f"/v1/sandboxes/{id_or_name}", _model(SandboxInfo))


def list_call(include_terminated: bool, limit: int | None = None, after: str | None = None) -> Call:
    params = {"all": "true" if include_terminated else None, "limit": limit, "after": after}
    return Call("GET", "/v1/sandboxes", _models(SandboxInfo), params={k: v for k, v in params.items() if v} or None)


def fork_checkpoint_call(checkpoint: str, times: int) -> Call:
    return Call("POST", f"/v1/checkpoints/{checkpoint}/fork", _models(SandboxInfo), json={"times": times})


def remove_many_call(refs: list[str]) -> Call:
    def parsed(response: httpx.Response) -> list[str]:
        result = RemoveResult.model_validate(response.json())
        if result.failed:
            ref, why = next(iter(result.failed.items()))
            raise StasisError(f"{len(result.failed)} of {len(refs)} not removed ({ref}: {why})", failed=result.failed,
                              removed=result.removed)  # fmt: skip
        return result.removed

    return Call("POST", "/v1/sandboxes/remove", parsed, json={"refs": refs})


def list_checkpoints_call() -> Call:
    return Call("GET", "/v1/checkpoints", _models(CheckpointInfo))


def resume_call(ref: str) -> Call:
    return Call("POST", f"/v1/sandboxes/{ref}/resume", _model(SandboxInfo))


def checkpoint_call(method: str, checkpoint_id: str) -> Call:
    return Call(method, f"/v1/checkpoints/{checkpoint_id}", _model(CheckpointInfo))


def run_request(command: Command, args: list[str] | None, options: RunOptions) -> RunRequest:
    stdin = options.get("stdin")
    max_output = options.get("max_output")
    return build(
        RunRequest,
        cmd=command_argv(command, args),
        env=options.get("env") or {},
        cwd=options.get("working_dir"),
        timeout=options.get("timeout"),
        exec_id=options.get("exec_id"),
        stdin_b64=None if stdin is None else _b64(stdin),
        user=options.get("user"),
        **({"max_output": max_output} if max_output else {}),
    )


class SandboxBase:
    """State and recipes of one sandbox; the twins add I/O through their ``_client``."""

    def __init__(self, info: SandboxInfo, client: Any) -> None:
        self._info = info
        self._client = client

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def name(self) -> str | None:
        return self._info.name

    @property
    def status(self) -> SandboxStatus:
        """As of the last call; ``info()`` refreshes it."""
        return self._info.status

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} name={self.name!r} status={self.status.value}>"

    @property
    def _url(self) -> str:
        return f"/v1/sandboxes/{self._info.id}"

    def _keep(self, response: httpx.Response) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(response.json())
        return self._info

    # -- lifecycle

    def _info_call(self) -> Call:
        return Call("GET", self._url, self._keep)

    def _lifecycle_call(self, action: str) -> Call:
        return Call("POST", f"{self._url}/{action}", self._keep)

    def _suspend_call(self, keep_memory: bool | None) -> Call:
        params = None if keep_memory is None else {"keep_memory": str(keep_memory).lower()}
        return Call("POST", f"{self._url}/suspend", self._keep, params=params)

    def _terminate_call(self) -> Call:
        return Call("DELETE", self._url, self._keep)

    def _checkpoint_call(self, checkpoint_type: CheckpointType | str, options: CheckpointOptions) -> Call:
        request = build(
            CreateCheckpointRequest, type=CheckpointType(checkpoint_type), name=options.get("name"),
            metadata=options.get("metadata") or {}, ttl_secs=options.get("ttl_secs"),
            include_volumes=options.get("include_volumes", False),
        )  # fmt: skip
        return Call("POST", f"{self._url}/checkpoints", _model(CheckpointInfo), json=request.model_dump(mode="json"))

    def _fork_call(self, times: int) -> Call:
        return Call("POST", f"{self._url}/fork", _models(SandboxInfo), json={"times": times})

    # -- commands

    def _run_call(self, request: RunRequest) -> Call:
        body = request.model_dump(exclude_none=True)
        return Call(
            "POST",
            f"{self._url}/exec",
            lambda r: CommandResult.from_wire(RunResult.model_validate(r.json())),
            json=body,
        )

    def _stream_call(self, request: RunRequest) -> Call:
        return Call("POST", f"{self._url}/exec/stream", json=request.model_dump(exclude_none=True))

    @staticmethod
    def _run_plan(command: Command, args: Args, options: WatchedRunOptions) -> tuple[RunRequest, Collector | None]:
        """The request, and (when output is watched) the collector its streamed events go to."""
        rest = dict(options)
        on_stdout, on_stderr = rest.pop("on_stdout", None), rest.pop("on_stderr", None)
        request = run_request(command, args, rest)  # type: ignore[arg-type]
        watched = on_stdout is not None or on_stderr is not None
        return request, Collector(on_stdout, on_stderr, request.max_output) if watched else None  # type: ignore[arg-type]

    def _start_process_call(self, command: Command, args: list[str] | None, options: ProcessOptions) -> Call:
        request = build(
            StartProcessRequest, cmd=command_argv(command, args), env=options.get("env") or {},
            cwd=options.get("working_dir"), name=options.get("name"), stdin=options.get("stdin", False),
            user=options.get("user"),
        )  # fmt: skip
        return Call("POST", f"{self._url}/processes", _model(ProcessInfo), json=request.model_dump())

    def _processes_call(self) -> Call:
        return Call("GET", f"{self._url}/processes", _models(ProcessInfo))

    def _process_call(self, process_id: str) -> Call:
        return Call("GET", f"{self._url}/processes/{process_id}", _model(ProcessInfo))

    def _output_call(self, process_id: str, stream: str, offset: int, max_bytes: int, wait: float) -> Call:
        params = {"stream": stream, "offset": offset, "max_bytes": max_bytes, "wait": wait}
        return Call("GET", f"{self._url}/processes/{process_id}/output", _model(ProcessOutput), params=params)

    def _signal_call(self, process_id: str, signal: str) -> Call:
        url = f"{self._url}/processes/{process_id}/signal"
        return Call("POST", url, _model(ProcessInfo), json={"signal": signal})

    def _stdin_call(self, process_id: str, data: bytes | str, close: bool) -> Call:
        body = {"data_b64": _b64(data), "close": close}
        return Call("POST", f"{self._url}/processes/{process_id}/stdin", json=body)

    # -- files

    def _read_call(self, path: str) -> Call:
        return Call("GET", f"{self._url}/files", lambda r: r.content, params={"path": path})

    def _write_call(self, path: str, data: bytes | str, mode: int) -> Call:
        params = {"path": path, "mode": mode}
        return Call("PUT", f"{self._url}/files", _model(FileEntry), params=params, content=_bytes(data))

    def _upload_tar_call(self, tar: bytes, path: str, replace: bool) -> Call:
        params = {"path": path, "replace": "true" if replace else "false"}
        return Call("PUT", f"{self._url}/dirs", _model(FileEntry), params=params, content=tar)

    def _download_dir_call(self, path: str) -> Call:
        return Call("GET", f"{self._url}/dirs", lambda r: r.content, params={"path": path})

    def _list_call(self, path: str) -> Call:
        return Call("GET", f"{self._url}/files/list", _models(FileEntry), params={"path": path})

    def _stat_call(self, path: str) -> Call:
        return Call("GET", f"{self._url}/files/stat", _model(FileEntry), params={"path": path})

    def _remove_call(self, path: str, recursive: bool) -> Call:
        return Call("DELETE", f"{self._url}/files", params={"path": path, "recursive": recursive})

    def _mkdir_call(self, path: str) -> Call:
        return Call("POST", f"{self._url}/files/mkdir", _model(FileEntry), params={"path": path})

    # -- ssh

    def _ssh_host_key_call(self) -> Call:
        return Call("GET", f"{self._url}/ssh/host-key", lambda r: SshHostKey.model_validate(r.json()).public_key)

    def _ssh_authorize_call(self, public_keys: list[str]) -> Call:
        keys = [key.strip() for key in public_keys if key.strip()]
        return Call("POST", f"{self._url}/ssh/keys", json=SshKeysRequest(public_keys=keys).model_dump())

    # -- network

    def _update_network_call(self, policy: NetworkPolicy | bool | dict[str, Any]) -> Call:
        chosen = as_policy(policy)
        if chosen is None:
            raise InvalidRequest("a live update keeps the network device: pass NetworkPolicy.no_egress() to cut egress")
        return Call("PUT", f"{self._url}/network", self._keep, json=chosen.model_dump())

    def _expose_port_call(self, port: int, public: bool, ttl_secs: int) -> Call:
        body = build(ExposePortRequest, port=port, public=public, ttl_secs=ttl_secs).model_dump()
        return Call("POST", f"{self._url}/ports", _model(ExposedPort), json=body)

    def _ports_call(self) -> Call:
        return Call("GET", f"{self._url}/ports", _models(ExposedPort))

    def _egress_call(self, follow: bool = False) -> Call:
        return Call("GET", f"{self._url}/egress", lambda r: r.json(), params={"follow": "true"} if follow else None)

    def _unexpose_port_call(self, port: int) -> Call:
        return Call("DELETE", f"{self._url}/ports/{port}")
