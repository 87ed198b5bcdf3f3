"""What a client does inside a running sandbox: commands, processes, terminals, files.

A mixin of :class:`~stasis.daemon.service.SandboxService`: every operation goes through
``_guest``, which resumes a suspended sandbox first and keeps it busy while it runs.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..errors import GuestDisconnected, StateError
from ..guest.channel import GuestChannel, b64decode, b64encode
from ..models import (
    FileEntry,
    ProcessInfo,
    ProcessOutput,
    RunRequest,
    RunResult,
    SandboxStatus,
    StartProcessRequest,
)

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from .store import Store

S = SandboxStatus
FILE_CHUNK = 1 << 20  # bytes per write request to the agent (1.4 MB of base64 on the wire)
READ_CHUNK = 4 << 20


class GuestOperations:
    if TYPE_CHECKING:
        store: Store

        def _guest(self, ref: str) -> AbstractAsyncContextManager[GuestChannel]: ...

    async def run(self, ref: str, request: RunRequest) -> RunResult:
        args: dict[str, Any] = request.model_dump(exclude={"stdin_b64"}, exclude_none=True)
        if request.stdin_b64 is not None:
            args["stdin"] = True
            args["stdin_data"] = request.stdin_b64
        args.setdefault("exec_id", "x-" + secrets.token_hex(8))  # so an interrupted run can be reattached
        try:
            async with self._guest(ref) as channel:
                result = await channel.call("exec", args, timeout=None)
        except GuestDisconnected as exc:
            status = self.store.get(ref).status
            if status in (S.SUSPENDING, S.SUSPENDED):
                raise StateError(
                    f"the sandbox was suspended while the command ran; it goes on after resume: "
                    f"run again with exec_id={args['exec_id']!r} to collect its result",
                    exec_id=args["exec_id"],
                ) from exc
            raise
        return RunResult(
            exec_id=result["exec_id"],
            exit_code=result["exit_code"],
            stdout_b64=result["stdout"],
            stderr_b64=result["stderr"],
            stdout_truncated=result["stdout_truncated"],
            stderr_truncated=result["stderr_truncated"],
            timed_out=result["timed_out"],
            duration=result["duration"],
        )

    async def run_stream(self, ref: str, request: RunRequest) -> AsyncIterator[dict[str, Any]]:
        """Run a command and yield its output as it comes: {"stdout": b64} / {"stderr": b64}, then
        {"exit_code", "timed_out", "exec_id"}. The command is a background process under ``exec_id``,
        so a client that goes away can still collect it."""
        exec_id = request.exec_id or "x-" + secrets.token_hex(8)
        start = {"cmd": request.cmd, "env": request.env, "cwd": request.cwd, "id": exec_id}
        async with self._guest(ref) as channel:
            await channel.call("process_start", start)
            yield {"exec_id": exec_id}
            offsets = {"stdout": 0, "stderr": 0}
            deadline = None if request.timeout is None else time.monotonic() + request.timeout
            timed_out = False
            while True:
                read = {"id": exec_id, "stdout_offset": offsets["stdout"], "stderr_offset": offsets["stderr"]}
                reply = await channel.call("process_read", {**read, "wait": 1.0}, timeout=60)
                quiet = True
                for name in ("stdout", "stderr"):
                    part = reply[name]
                    if part["data"]:
                        quiet = False
                        yield {name: part["data"]}
                    offsets[name] = part["next_offset"]
                drained = reply["stdout"]["eof"] and reply["stderr"]["eof"]
                if reply["exit_code"] is not None and (drained or quiet):  # a daemonised grandchild may hold a pipe
                    yield {"exit_code": reply["exit_code"], "timed_out": timed_out, "exec_id": exec_id}
                    return
                if deadline is not None and time.monotonic() > deadline and not timed_out:
                    timed_out = True
                    await channel.call("process_signal", {"id": exec_id, "signal": "SIGKILL"})

    # ------------------------------------------------------------ terminals

    @contextlib.asynccontextmanager
    async def attached(self, ref: str) -> AsyncIterator[GuestChannel]:
        """Hold a sandbox in use (never idle-suspended) for as long as a terminal is attached."""
        async with self._guest(ref) as channel:
            yield channel

    async def exec_status(self, ref: str, exec_id: str) -> dict[str, Any]:
        async with self._guest(ref) as channel:
            return await channel.call("exec_status", {"exec_id": exec_id})

    async def start_process(self, ref: str, request: StartProcessRequest) -> ProcessInfo:
        async with self._guest(ref) as channel:
            return ProcessInfo.model_validate(await channel.call("process_start", request.model_dump()))

    async def list_processes(self, ref: str) -> list[ProcessInfo]:
        async with self._guest(ref) as channel:
            result = await channel.call("process_list")
        return [ProcessInfo.model_validate(p) for p in result["processes"]]

    async def get_process(self, ref: str, process_id: str) -> ProcessInfo:
        async with self._guest(ref) as channel:
            return ProcessInfo.model_validate(await channel.call("process_get", {"id": process_id}))

    async def process_output(
        self, ref: str, process_id: str, stream: str, offset: int, max_bytes: int, wait: float
    ) -> ProcessOutput:
        args = {"id": process_id, "stream": stream, "offset": offset, "max_bytes": max_bytes, "wait": wait}
        async with self._guest(ref) as channel:
            result = await channel.call("process_output", args, timeout=wait + 30)
        result["data_b64"] = result.pop("data")
        return ProcessOutput.model_validate(result)

    async def signal_process(self, ref: str, process_id: str, signal: str) -> ProcessInfo:
        async with self._guest(ref) as channel:
            return ProcessInfo.model_validate(
                await channel.call("process_signal", {"id": process_id, "signal": signal})
            )

    async def write_stdin(self, ref: str, process_id: str, data_b64: str, close: bool) -> None:
        async with self._guest(ref) as channel:
            await channel.call("process_stdin", {"id": process_id, "data": data_b64, "close": close})

    # ------------------------------------------------------------ files

    async def read_file(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """The file's bytes in chunks; errors (missing file, directory) surface before the first chunk."""
        async with self._guest(ref) as channel:
            first = await channel.call("file_read", {"path": path, "offset": 0, "length": READ_CHUNK})

        async def chunks() -> AsyncIterator[bytes]:
            data = b64decode(first["data"])
            yield data
            offset, eof = len(data), first["eof"]
            while not eof:
                async with self._guest(ref) as channel:
                    part = await channel.call("file_read", {"path": path, "offset": offset, "length": READ_CHUNK})
                data = b64decode(part["data"])
                if not data:
                    break
                yield data
                offset += len(data)
                eof = part["eof"]

        return chunks()

    async def write_file(self, ref: str, path: str, data: bytes, mode: int = 0o644) -> FileEntry:
        upload_id = secrets.token_hex(6)
        async with self._guest(ref) as channel:
            offset = 0
            while True:
                chunk = data[offset : offset + FILE_CHUNK]
                final = offset + len(chunk) >= len(data)
                args = {"path": path, "data": b64encode(chunk), "offset": offset, "final": final}
                await channel.call("file_write", {**args, "upload_id": upload_id, "mode": mode}, timeout=120)
                offset += len(chunk)
                if final:
                    break
            return FileEntry.model_validate(await channel.call("file_stat", {"path": path}))

    async def list_directory(self, ref: str, path: str) -> list[FileEntry]:
        async with self._guest(ref) as channel:
            result = await channel.call("file_list", {"path": path})
        return [FileEntry.model_validate(e) for e in result["entries"]]

    async def stat(self, ref: str, path: str) -> FileEntry:
        async with self._guest(ref) as channel:
            return FileEntry.model_validate(await channel.call("file_stat", {"path": path}))

    async def delete_file(self, ref: str, path: str, recursive: bool) -> None:
        async with self._guest(ref) as channel:
            await channel.call("file_delete", {"path": path, "recursive": recursive})

    async def mkdir(self, ref: str, path: str) -> FileEntry:
        async with self._guest(ref) as channel:
            await channel.call("mkdir", {"path": path})
            return FileEntry.model_validate(await channel.call("file_stat", {"path": path}))
