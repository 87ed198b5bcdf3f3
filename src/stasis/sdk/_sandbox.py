"""``Sandbox`` and ``AsyncSandbox``: the objects users hold.

Both build requests with the same pure helpers below; only the I/O differs.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..models import (
    CheckpointInfo,
    CheckpointType,
    CreateCheckpointRequest,
    CreateSandboxRequest,
    FileEntry,
    ProcessInfo,
    ProcessOutput,
    RunRequest,
    RunResult,
    SandboxInfo,
    SandboxStatus,
    StartProcessRequest,
    build,
)
from ._client import AsyncClient, Client

EXIT_CODE_TIMEOUT = 124  # what `timeout(1)` returns; used by the CLI


@dataclass(frozen=True)
class CommandResult:
    """The outcome of :meth:`Sandbox.run`. ``stdout``/``stderr`` are decoded; ``*_bytes`` are exact."""

    exec_id: str
    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration: float

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode(errors="replace")

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @classmethod
    def from_wire(cls, result: RunResult) -> CommandResult:
        return cls(
            exec_id=result.exec_id,
            exit_code=result.exit_code,
            stdout_bytes=base64.b64decode(result.stdout_b64),
            stderr_bytes=base64.b64decode(result.stderr_b64),
            stdout_truncated=result.stdout_truncated,
            stderr_truncated=result.stderr_truncated,
            timed_out=result.timed_out,
            duration=result.duration,
        )


OutputCallback = Callable[[bytes], None]


@dataclass(frozen=True)
class OutputEvent:
    """One piece of a streamed run: output on ``stdout``/``stderr``, or (last) the ``exit`` event."""

    kind: str  # "stdout" | "stderr" | "exit"
    data: bytes = b""
    exit_code: int | None = None
    timed_out: bool = False
    exec_id: str = ""


def stream_event(event: dict[str, Any]) -> OutputEvent | None:
    for kind in ("stdout", "stderr"):
        if kind in event:
            return OutputEvent(kind, base64.b64decode(event[kind]))
    if "exit_code" in event:
        return OutputEvent("exit", exit_code=event["exit_code"], timed_out=event["timed_out"], exec_id=event["exec_id"])
    return None  # the opening {"exec_id"} line


class _Collector:
    """Builds a CommandResult from streamed events, feeding the callbacks on the way."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None, started: float) -> None:
        self.parts: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self.started = started
        self.result: CommandResult | None = None

    def feed(self, event: OutputEvent) -> None:
        if event.kind == "exit":
            self.result = CommandResult(
                exec_id=event.exec_id, exit_code=event.exit_code if event.exit_code is not None else -1,
                stdout_bytes=bytes(self.parts["stdout"]), stderr_bytes=bytes(self.parts["stderr"]),
                stdout_truncated=False, stderr_truncated=False, timed_out=event.timed_out,
                duration=time.monotonic() - self.started,
            )  # fmt: skip
            return
        self.parts[event.kind] += event.data
        callback = self.callbacks[event.kind]
        if callback is not None:
            callback(event.data)


def command_argv(command: str | list[str], args: list[str] | None) -> list[str]:
    """``run("ls -la")`` goes through the shell; ``run("ls", ["-la"])`` and ``run(["ls", "-la"])`` do not."""
    if isinstance(command, list):
        return [*command, *(args or [])]
    if args is None:
        return ["/bin/sh", "-c", command]
    return [command, *args]


def run_body(
    command: str | list[str],
    args: list[str] | None,
    env: dict[str, str] | None,
    working_dir: str | None,
    timeout: float | None,
    max_output: int | None,
    exec_id: str | None,
    stdin: bytes | str | None,
) -> dict[str, Any]:
    request = build(
        RunRequest,
        cmd=command_argv(command, args),
        env=env or {},
        cwd=working_dir,
        timeout=timeout,
        exec_id=exec_id,
        stdin_b64=None if stdin is None else base64.b64encode(_bytes(stdin)).decode(),
        **({"max_output": max_output} if max_output else {}),
    )
    return request.model_dump(exclude_none=True)


def process_body(
    command: str | list[str],
    args: list[str] | None,
    env: dict[str, str] | None,
    working_dir: str | None,
    name: str | None,
    stdin: bool,
) -> dict[str, Any]:
    cmd = command_argv(command, args)
    return build(StartProcessRequest, cmd=cmd, env=env or {}, cwd=working_dir, name=name, stdin=stdin).model_dump()


def checkpoint_body(
    checkpoint_type: CheckpointType | str, name: str | None, metadata: dict[str, Any] | None, ttl_secs: int | None
) -> dict[str, Any]:
    request = build(
        CreateCheckpointRequest, type=CheckpointType(checkpoint_type), name=name, metadata=metadata or {},
        ttl_secs=ttl_secs,
    )  # fmt: skip
    return request.model_dump(mode="json")


def _bytes(data: bytes | str) -> bytes:
    return data.encode() if isinstance(data, str) else data


def create_body(name: str | None, **spec: Any) -> dict[str, Any]:
    fields = {k: v for k, v in spec.items() if v is not None}
    return build(CreateSandboxRequest, name=name, **fields).model_dump(exclude_unset=True)


class _SandboxBase:
    def __init__(self, info: SandboxInfo) -> None:
        self._info = info

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def name(self) -> str | None:
        return self._info.name

    @property
    def status(self) -> SandboxStatus:
        """As of the last call; :meth:`info` refreshes it."""
        return self._info.status

    @property
    def _base(self) -> str:
        return f"/v1/sandboxes/{self._info.id}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} name={self.name!r} status={self.status.value}>"


class Sandbox(_SandboxBase):
    """A sandbox, driven synchronously."""

    def __init__(self, info: SandboxInfo, client: Client) -> None:
        super().__init__(info)
        self._client = client

    # ---------------------------------------------------- lifecycle

    @classmethod
    def create(
        cls,
        name: str | None = None,
        *,
        image: str | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        timeout_secs: int | None = None,
        on_idle: str | None = None,
        backend: str | None = None,
        network: bool | None = None,
        snapshot_id: str | None = None,
        client: Client | None = None,
    ) -> Sandbox:
        """A new sandbox: from an image, or from a checkpoint (``snapshot_id``: its processes and files)."""
        client = client or Client()
        body = create_body(
            name, image=image, cpus=cpus, memory_mb=memory_mb, timeout_secs=timeout_secs,
            on_idle=on_idle, backend=backend, network=network, snapshot_id=snapshot_id,
        )  # fmt: skip
        return cls(SandboxInfo.model_validate(client.json("POST", "/v1/sandboxes", json=body)), client)

    @classmethod
    def connect(cls, id_or_name: str, client: Client | None = None) -> Sandbox:
        client = client or Client()
        return cls(SandboxInfo.model_validate(client.json("GET", f"/v1/sandboxes/{id_or_name}")), client)

    @classmethod
    def list(cls, include_terminated: bool = False, client: Client | None = None) -> list[SandboxInfo]:
        client = client or Client()
        params = {"all": "true"} if include_terminated else {}
        return [SandboxInfo.model_validate(s) for s in client.json("GET", "/v1/sandboxes", params=params)]

    def info(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(self._client.json("GET", self._base))
        return self._info

    def suspend(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(self._client.json("POST", f"{self._base}/suspend"))
        return self._info

    def resume(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(self._client.json("POST", f"{self._base}/resume"))
        return self._info

    def terminate(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(self._client.json("DELETE", self._base))
        return self._info

    def close(self) -> None:
        """Close the connection to the daemon; the sandbox keeps running."""
        self._client.close()

    # ---------------------------------------------------- checkpoints and forks

    def checkpoint(
        self,
        checkpoint_type: CheckpointType | str = CheckpointType.MEMORY,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        ttl_secs: int | None = None,
    ) -> CheckpointInfo:
        """An immutable artifact of this instant; the sandbox keeps running. Restore with ``create(snapshot_id=)``."""
        body = checkpoint_body(checkpoint_type, name, metadata, ttl_secs)
        return CheckpointInfo.model_validate(self._client.json("POST", f"{self._base}/checkpoints", json=body))

    def copy(self, times: int = 1) -> list[Sandbox]:
        """Live forks: new running sandboxes that continue from this instant, then diverge."""
        infos = self._client.json("POST", f"{self._base}/fork", json={"times": times})
        return [Sandbox(SandboxInfo.model_validate(i), self._client) for i in infos]

    @classmethod
    def list_checkpoints(cls, client: Client | None = None) -> list[CheckpointInfo]:
        client = client or Client()
        return [CheckpointInfo.model_validate(c) for c in client.json("GET", "/v1/checkpoints")]

    @classmethod
    def get_checkpoint(cls, checkpoint_id: str, client: Client | None = None) -> CheckpointInfo:
        client = client or Client()
        return CheckpointInfo.model_validate(client.json("GET", f"/v1/checkpoints/{checkpoint_id}"))

    @classmethod
    def delete_checkpoint(cls, checkpoint_id: str, client: Client | None = None) -> CheckpointInfo:
        client = client or Client()
        return CheckpointInfo.model_validate(client.json("DELETE", f"/v1/checkpoints/{checkpoint_id}"))

    # ---------------------------------------------------- commands

    def run(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        timeout: float | None = None,
        max_output: int | None = None,
        exec_id: str | None = None,
        stdin: bytes | str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> CommandResult:
        """Run to completion. With ``on_stdout``/``on_stderr``, output reaches them as it is produced."""
        body = run_body(command, args, env, working_dir, timeout, max_output, exec_id, stdin)
        if on_stdout is None and on_stderr is None:
            result = self._client.json("POST", f"{self._base}/exec", json=body)
            return CommandResult.from_wire(RunResult.model_validate(result))
        collector = _Collector(on_stdout, on_stderr, time.monotonic())
        for event in self.stream(command, args, env=env, working_dir=working_dir, timeout=timeout, exec_id=exec_id):
            collector.feed(event)
        assert collector.result is not None
        return collector.result

    def stream(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        timeout: float | None = None,
        exec_id: str | None = None,
    ) -> Iterator[OutputEvent]:
        """Run and yield stdout/stderr chunks while the command runs; the last event is ``exit``."""
        body = run_body(command, args, env, working_dir, timeout, None, exec_id, None)
        for line in self._client.stream_lines("POST", f"{self._base}/exec/stream", json=body):
            event = stream_event(line)
            if event is not None:
                yield event

    def follow_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, wait: float = 5.0
    ) -> Iterator[tuple[int, bytes]]:
        """(offset, bytes) chunks of a process's output from ``offset`` until it ends.

        Keep the last offset plus the chunk's length: a client that comes back (after a kill, or a
        suspend) continues from there with nothing lost or repeated.
        """
        while True:
            chunk = self.process_output(process_id, stream=stream, offset=offset, wait=wait)
            data = base64.b64decode(chunk.data_b64)
            if data:
                yield chunk.offset, data
            offset = chunk.next_offset
            if chunk.eof:
                return

    def close_stdin(self, process_id: str) -> None:
        self.write_stdin(process_id, b"", close=True)

    def start_process(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        name: str | None = None,
        stdin: bool = False,
    ) -> ProcessInfo:
        body = process_body(command, args, env, working_dir, name, stdin)
        return ProcessInfo.model_validate(self._client.json("POST", f"{self._base}/processes", json=body))

    def list_processes(self) -> list[ProcessInfo]:
        return [ProcessInfo.model_validate(p) for p in self._client.json("GET", f"{self._base}/processes")]

    def get_process(self, process_id: str) -> ProcessInfo:
        return ProcessInfo.model_validate(self._client.json("GET", f"{self._base}/processes/{process_id}"))

    def process_output(
        self,
        process_id: str,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int = 1 << 20,
        wait: float = 0,
    ) -> ProcessOutput:
        params = {"stream": stream, "offset": offset, "max_bytes": max_bytes, "wait": wait}
        url = f"{self._base}/processes/{process_id}/output"
        return ProcessOutput.model_validate(self._client.json("GET", url, params=params))

    def send_signal(self, process_id: str, signal: str = "SIGTERM") -> ProcessInfo:
        url = f"{self._base}/processes/{process_id}/signal"
        return ProcessInfo.model_validate(self._client.json("POST", url, json={"signal": signal}))

    def kill_process(self, process_id: str) -> ProcessInfo:
        return self.send_signal(process_id, "SIGKILL")

    def write_stdin(self, process_id: str, data: bytes | str, close: bool = False) -> None:
        body = {"data_b64": base64.b64encode(_bytes(data)).decode(), "close": close}
        self._client.request("POST", f"{self._base}/processes/{process_id}/stdin", json=body)

    # ---------------------------------------------------- files

    def read_file(self, path: str) -> bytes:
        return self._client.request("GET", f"{self._base}/files", params={"path": path}).content

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> FileEntry:
        url = f"{self._base}/files"
        response = self._client.json("PUT", url, params={"path": path, "mode": mode}, content=_bytes(data))
        return FileEntry.model_validate(response)

    def list_directory(self, path: str = "/root") -> list[FileEntry]:
        return [
            FileEntry.model_validate(e)
            for e in self._client.json("GET", f"{self._base}/files/list", params={"path": path})
        ]

    def stat(self, path: str) -> FileEntry:
        return FileEntry.model_validate(self._client.json("GET", f"{self._base}/files/stat", params={"path": path}))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._client.request("DELETE", f"{self._base}/files", params={"path": path, "recursive": recursive})

    def make_dir(self, path: str) -> FileEntry:
        return FileEntry.model_validate(self._client.json("POST", f"{self._base}/files/mkdir", params={"path": path}))


class AsyncSandbox(_SandboxBase):
    """A sandbox, driven from asyncio. Same methods as :class:`Sandbox`, awaited."""

    def __init__(self, info: SandboxInfo, client: AsyncClient) -> None:
        super().__init__(info)
        self._client = client

    # ---------------------------------------------------- lifecycle

    @classmethod
    async def create(
        cls,
        name: str | None = None,
        *,
        image: str | None = None,
        cpus: float | None = None,
        memory_mb: int | None = None,
        timeout_secs: int | None = None,
        on_idle: str | None = None,
        backend: str | None = None,
        network: bool | None = None,
        snapshot_id: str | None = None,
        client: AsyncClient | None = None,
    ) -> AsyncSandbox:
        """A new sandbox: from an image, or from a checkpoint (``snapshot_id``: its processes and files)."""
        client = client or AsyncClient()
        body = create_body(
            name, image=image, cpus=cpus, memory_mb=memory_mb, timeout_secs=timeout_secs,
            on_idle=on_idle, backend=backend, network=network, snapshot_id=snapshot_id,
        )  # fmt: skip
        return cls(SandboxInfo.model_validate(await client.json("POST", "/v1/sandboxes", json=body)), client)

    @classmethod
    async def connect(cls, id_or_name: str, client: AsyncClient | None = None) -> AsyncSandbox:
        client = client or AsyncClient()
        return cls(SandboxInfo.model_validate(await client.json("GET", f"/v1/sandboxes/{id_or_name}")), client)

    @classmethod
    async def list(cls, include_terminated: bool = False, client: AsyncClient | None = None) -> list[SandboxInfo]:
        client = client or AsyncClient()
        params = {"all": "true"} if include_terminated else {}
        return [SandboxInfo.model_validate(s) for s in await client.json("GET", "/v1/sandboxes", params=params)]

    async def info(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(await self._client.json("GET", self._base))
        return self._info

    async def suspend(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(await self._client.json("POST", f"{self._base}/suspend"))
        return self._info

    async def resume(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(await self._client.json("POST", f"{self._base}/resume"))
        return self._info

    async def terminate(self) -> SandboxInfo:
        self._info = SandboxInfo.model_validate(await self._client.json("DELETE", self._base))
        return self._info

    async def aclose(self) -> None:
        await self._client.aclose()

    # ---------------------------------------------------- checkpoints and forks

    async def checkpoint(
        self,
        checkpoint_type: CheckpointType | str = CheckpointType.MEMORY,
        name: str | None = None,
        metadata: dict[str, Any] | None = None,
        ttl_secs: int | None = None,
    ) -> CheckpointInfo:
        body = checkpoint_body(checkpoint_type, name, metadata, ttl_secs)
        return CheckpointInfo.model_validate(await self._client.json("POST", f"{self._base}/checkpoints", json=body))

    async def copy(self, times: int = 1) -> list[AsyncSandbox]:
        infos = await self._client.json("POST", f"{self._base}/fork", json={"times": times})
        return [AsyncSandbox(SandboxInfo.model_validate(i), self._client) for i in infos]

    @classmethod
    async def list_checkpoints(cls, client: AsyncClient | None = None) -> list[CheckpointInfo]:
        client = client or AsyncClient()
        return [CheckpointInfo.model_validate(c) for c in await client.json("GET", "/v1/checkpoints")]

    @classmethod
    async def get_checkpoint(cls, checkpoint_id: str, client: AsyncClient | None = None) -> CheckpointInfo:
        client = client or AsyncClient()
        return CheckpointInfo.model_validate(await client.json("GET", f"/v1/checkpoints/{checkpoint_id}"))

    @classmethod
    async def delete_checkpoint(cls, checkpoint_id: str, client: AsyncClient | None = None) -> CheckpointInfo:
        client = client or AsyncClient()
        return CheckpointInfo.model_validate(await client.json("DELETE", f"/v1/checkpoints/{checkpoint_id}"))

    # ---------------------------------------------------- commands

    async def run(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        timeout: float | None = None,
        max_output: int | None = None,
        exec_id: str | None = None,
        stdin: bytes | str | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
    ) -> CommandResult:
        body = run_body(command, args, env, working_dir, timeout, max_output, exec_id, stdin)
        if on_stdout is None and on_stderr is None:
            result = await self._client.json("POST", f"{self._base}/exec", json=body)
            return CommandResult.from_wire(RunResult.model_validate(result))
        collector = _Collector(on_stdout, on_stderr, time.monotonic())
        async for event in self.stream(
            command, args, env=env, working_dir=working_dir, timeout=timeout, exec_id=exec_id
        ):
            collector.feed(event)
        assert collector.result is not None
        return collector.result

    async def stream(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        timeout: float | None = None,
        exec_id: str | None = None,
    ) -> AsyncIterator[OutputEvent]:
        body = run_body(command, args, env, working_dir, timeout, None, exec_id, None)
        async for line in self._client.stream_lines("POST", f"{self._base}/exec/stream", json=body):
            event = stream_event(line)
            if event is not None:
                yield event

    async def follow_output(
        self, process_id: str, stream: str = "stdout", offset: int = 0, wait: float = 5.0
    ) -> AsyncIterator[tuple[int, bytes]]:
        while True:
            chunk = await self.process_output(process_id, stream=stream, offset=offset, wait=wait)
            data = base64.b64decode(chunk.data_b64)
            if data:
                yield chunk.offset, data
            offset = chunk.next_offset
            if chunk.eof:
                return

    async def close_stdin(self, process_id: str) -> None:
        await self.write_stdin(process_id, b"", close=True)

    async def start_process(
        self,
        command: str | list[str],
        args: list[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        working_dir: str | None = None,
        name: str | None = None,
        stdin: bool = False,
    ) -> ProcessInfo:
        body = process_body(command, args, env, working_dir, name, stdin)
        return ProcessInfo.model_validate(await self._client.json("POST", f"{self._base}/processes", json=body))

    async def list_processes(self) -> list[ProcessInfo]:
        return [ProcessInfo.model_validate(p) for p in await self._client.json("GET", f"{self._base}/processes")]

    async def get_process(self, process_id: str) -> ProcessInfo:
        return ProcessInfo.model_validate(await self._client.json("GET", f"{self._base}/processes/{process_id}"))

    async def process_output(
        self,
        process_id: str,
        stream: str = "stdout",
        offset: int = 0,
        max_bytes: int = 1 << 20,
        wait: float = 0,
    ) -> ProcessOutput:
        params = {"stream": stream, "offset": offset, "max_bytes": max_bytes, "wait": wait}
        url = f"{self._base}/processes/{process_id}/output"
        return ProcessOutput.model_validate(await self._client.json("GET", url, params=params))

    async def send_signal(self, process_id: str, signal: str = "SIGTERM") -> ProcessInfo:
        url = f"{self._base}/processes/{process_id}/signal"
        return ProcessInfo.model_validate(await self._client.json("POST", url, json={"signal": signal}))

    async def kill_process(self, process_id: str) -> ProcessInfo:
        return await self.send_signal(process_id, "SIGKILL")

    async def write_stdin(self, process_id: str, data: bytes | str, close: bool = False) -> None:
        body = {"data_b64": base64.b64encode(_bytes(data)).decode(), "close": close}
        await self._client.request("POST", f"{self._base}/processes/{process_id}/stdin", json=body)

    # ---------------------------------------------------- files

    async def read_file(self, path: str) -> bytes:
        return (await self._client.request("GET", f"{self._base}/files", params={"path": path})).content

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> FileEntry:
        url = f"{self._base}/files"
        response = await self._client.json("PUT", url, params={"path": path, "mode": mode}, content=_bytes(data))
        return FileEntry.model_validate(response)

    async def list_directory(self, path: str = "/root") -> list[FileEntry]:
        entries = await self._client.json("GET", f"{self._base}/files/list", params={"path": path})
        return [FileEntry.model_validate(e) for e in entries]

    async def stat(self, path: str) -> FileEntry:
        return FileEntry.model_validate(
            await self._client.json("GET", f"{self._base}/files/stat", params={"path": path})
        )

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._client.request("DELETE", f"{self._base}/files", params={"path": path, "recursive": recursive})

    async def make_dir(self, path: str) -> FileEntry:
        return FileEntry.model_validate(
            await self._client.json("POST", f"{self._base}/files/mkdir", params={"path": path})
        )
