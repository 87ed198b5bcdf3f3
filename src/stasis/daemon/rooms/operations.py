"""What a client does inside a running sandbox: commands, processes, files.

Every operation goes through :meth:`SandboxService.guest`, which resumes a suspended
sandbox first and keeps it busy while it runs, and speaks the typed guest protocol.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from ... import tracing
from ...credentials import trust
from ...errors import GuestDisconnected, GuestTimeout, StasisError, StateError
from ...guest import protocol as P
from ...models import (
    FileEntry,
    ProcessInfo,
    ProcessOutput,
    RunRequest,
    RunResult,
    SandboxStatus,
    StartProcessRequest,
)
from ..core.service import SandboxService

log = logging.getLogger(__name__)

S = SandboxStatus
FILE_CHUNK = 1 << 20  # bytes per write request to the agent (1.4 MB of base64 on the wire)
READ_CHUNK = 4 << 20
STREAM_BUFFER = 8 << 20  # bytes of each stream the agent keeps for a streamed run, at least


def new_exec_id() -> str:
    return "x-" + secrets.token_hex(8)  # so an interrupted run can be reattached


async def _single(data: bytes) -> AsyncIterator[bytes]:
    yield data


def _process(state: P.ProcessState) -> ProcessInfo:
    return ProcessInfo.model_validate(asdict(state))


def _entry(stat: P.FileStat) -> FileEntry:
    return FileEntry.model_validate(asdict(stat))


DIR_TRANSFERS = "/var/lib/stasis/transfers"  # tar files of upload_dir/download_dir while they move


STREAMED_ENV = {"PYTHONUNBUFFERED": "1"}  # `python3 -m http.server`'s log reaches `stasis logs -f` as it is written
EXEC_REPLY_GRACE = 15.0  # seconds past a command's timeout for its reply (killing it, its output)
KILL_TRIES = 10  # a left streamed run's kill is tried again while the agent does not answer (a loaded host)


class GuestOperations:
    def __init__(self, service: SandboxService) -> None:
        self.service = service
        self._kills: set[asyncio.Task[None]] = set()

    def command_defaults(
        self, ref: str, env: dict[str, str], cwd: str | None, user: str | None, streamed: bool = False
    ) -> dict[str, Any]:
        """What the request says, over what the sandbox's image says (its Env, WorkingDir, User). A ``streamed``
        command's output is read as it comes: Python there writes it unbuffered unless told otherwise."""
        info = self.service.lookup(ref)
        image_env, image_cwd, image_user = self.service.command_defaults(info)
        base = STREAMED_ENV if streamed else {}
        if (parent := tracing.traceparent()) is not None:  # what the command does joins the caller's trace
            base = {**base, "TRACEPARENT": parent}
        if info.spec.ca_lineage is not None:  # a sandbox with secrets: their placeholders, and its CA trusted
            base = {**base, **trust.sandbox_env(info.spec.secrets)}
        return {"env": {**base, **image_env, **env}, "cwd": cwd or image_cwd, "user": user or image_user}

    async def run(self, ref: str, request: RunRequest) -> RunResult:
        info = self.service.lookup(ref)
        with tracing.span("sandbox.exec", info.id, info.spec.team, **{"stasis.command": request.cmd[0][:200]}):
            return await self._run(ref, request)

    async def _run(self, ref: str, request: RunRequest) -> RunResult:
        exec_id = request.exec_id or new_exec_id()
        op = P.Exec(
            cmd=request.cmd, timeout=request.timeout, max_output=request.max_output, exec_id=exec_id,
            stdin=request.stdin_b64 is not None, stdin_data=request.stdin_b64,
            **self.command_defaults(ref, request.env, request.cwd, request.user),
        )  # fmt: skip
        try:
            # A command with a timeout answers within it (the agent kills it then): past that and a grace,
            # the daemon gives up, and the request, if it had not started, expires in the channel.
            wait = None if request.timeout is None else request.timeout + EXEC_REPLY_GRACE
            async with self.service.guest(ref) as channel:
                result = await channel.call(op, timeout=wait)
        except GuestDisconnected as exc:
            if self.service.record(ref).status in (S.SUSPENDING, S.SUSPENDED):
                raise StateError(
                    f"the sandbox was suspended while the command ran; it goes on after resume: "
                    f"run again with exec_id={exec_id!r} to collect its result",
                    exec_id=exec_id,
                ) from exc
            raise
        return RunResult(
            exec_id=result.exec_id,
            exit_code=result.exit_code if result.exit_code is not None else -1,
            stdout_b64=result.stdout,
            stderr_b64=result.stderr,
            stdout_truncated=result.stdout_truncated,
            stderr_truncated=result.stderr_truncated,
            timed_out=result.timed_out,
            duration=result.duration,
            limit=result.limit,
        )

    async def run_stream(self, ref: str, request: RunRequest) -> AsyncIterator[dict[str, Any]]:
        """Run a command and yield its output as it comes: {"stdout": b64} / {"stderr": b64}, then
        {"exit_code", "timed_out", "exec_id", "stdout_truncated", "stderr_truncated", "limit"}. The command is
        a background process under ``exec_id``, so a client that goes away can still collect it (unless it
        asked the route for ``kill_on_disconnect``: see :meth:`kill_left_behind`). The
        agent keeps at least 8 MiB (or ``max_output``) of each stream; a reader that falls further behind
        loses the oldest bytes, and the exit event says so. Keeping only the last ``max_output`` bytes
        of what was streamed is the client's part."""
        exec_id = request.exec_id or new_exec_id()
        start = P.StartProcess(
            cmd=request.cmd, id=exec_id, stdin=request.stdin_b64 is not None, paced=True,
            max_output=max(request.max_output, STREAM_BUFFER),
            **self.command_defaults(ref, request.env, request.cwd, request.user, streamed=True),
        )  # fmt: skip
        async with self.service.guest(ref) as channel:
            await channel.call(start)
            if request.stdin_b64 is not None:
                with contextlib.suppress(StateError):  # it ended without reading it all, as `true < file` does
                    await channel.call(P.WriteStdin(id=exec_id, data=request.stdin_b64, close=True))
            yield {"exec_id": exec_id}
            offsets, lost = {"stdout": 0, "stderr": 0}, {"stdout": False, "stderr": False}
            deadline = None if request.timeout is None else time.monotonic() + request.timeout
            timed_out = False
            while True:
                read = P.ReadStreams(exec_id, offsets["stdout"], offsets["stderr"], wait=1.0)
                reply = await channel.call(read, timeout=60)
                quiet = True
                for name, part in (("stdout", reply.stdout), ("stderr", reply.stderr)):
                    lost[name] = lost[name] or part.lost > 0
                    if part.data:
                        quiet = False
                        yield {name: part.data}
                    offsets[name] = part.next_offset
                drained = reply.stdout.eof and reply.stderr.eof
                if reply.exit_code is not None and (drained or quiet):  # a daemonised grandchild may hold a pipe
                    yield {
                        "exit_code": reply.exit_code, "timed_out": timed_out, "exec_id": exec_id,
                        "stdout_truncated": lost["stdout"], "stderr_truncated": lost["stderr"],
                        "limit": reply.limit,
                    }  # fmt: skip
                    return
                if deadline is not None and time.monotonic() > deadline and not timed_out:
                    timed_out = True
                    await channel.call(P.SignalProcess(id=exec_id, signal="SIGKILL"))

    def kill_left_behind(self, ref: str, exec_id: str) -> None:
        """Kill the tree of a streamed run whose client went away before its exit, as sshd does a dropped session's,
        in the background (nobody waits for the answer), asking again while the agent does not answer."""
        task = asyncio.get_running_loop().create_task(self._kill_left(ref, exec_id))
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)

    async def _kill_left(self, ref: str, exec_id: str) -> None:
        for _ in range(KILL_TRIES):
            try:
                await self.signal_process(ref, exec_id, "SIGKILL")
                return
            except GuestTimeout:  # a starved agent: the request expired unrun
                continue
            except StasisError:  # it exited meanwhile, or its sandbox went: nothing left to kill
                return
        log.warning("%s in %s: its client went away and the kill went unanswered %d times", exec_id, ref, KILL_TRIES)

    async def exec_status(self, ref: str, exec_id: str) -> dict[str, Any]:
        async with self.service.guest(ref) as channel:
            result = await channel.call(P.ExecStatus(exec_id=exec_id))
        return (
            P.encode(result, keep_none=True)
            if result.status == "exited"
            else {"exec_id": result.exec_id, "status": "running"}
        )

    # ------------------------------------------------------------ processes

    async def start_process(self, ref: str, request: StartProcessRequest) -> ProcessInfo:
        defaults = self.command_defaults(ref, request.env, request.cwd, request.user, streamed=True)
        op = P.StartProcess(cmd=request.cmd, name=request.name, stdin=request.stdin, **defaults)
        async with self.service.guest(ref) as channel:
            return _process(await channel.call(op))

    async def list_processes(self, ref: str) -> list[ProcessInfo]:
        async with self.service.guest(ref) as channel:
            listing = await channel.call(P.ListProcesses())
        return [_process(p) for p in listing.processes]

    async def get_process(self, ref: str, process_id: str) -> ProcessInfo:
        async with self.service.guest(ref) as channel:
            return _process(await channel.call(P.GetProcess(id=process_id)))

    async def process_output(
        self, ref: str, process_id: str, stream: str, offset: int, max_bytes: int, wait: float
    ) -> ProcessOutput:
        op = P.ReadOutput(id=process_id, stream=stream, offset=offset, max_bytes=max_bytes, wait=wait)
        async with self.service.guest(ref) as channel:
            chunk = await channel.call(op, timeout=wait + 30)
        return ProcessOutput(
            data_b64=chunk.data, offset=chunk.offset, next_offset=chunk.next_offset, lost=chunk.lost,
            eof=chunk.eof, exit_code=chunk.exit_code,
        )  # fmt: skip

    async def signal_process(self, ref: str, process_id: str, signal: str) -> ProcessInfo:
        async with self.service.guest(ref) as channel:
            return _process(await channel.call(P.SignalProcess(id=process_id, signal=signal)))

    async def write_stdin(self, ref: str, process_id: str, data_b64: str, close: bool) -> None:
        async with self.service.guest(ref) as channel:
            await channel.call(P.WriteStdin(id=process_id, data=data_b64, close=close))

    # ------------------------------------------------------------ files

    async def read_file(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """The file's bytes in chunks; errors (missing file, directory) surface before the first chunk."""
        async with self.service.guest(ref) as channel:
            first = await channel.call(P.ReadFile(path=path, offset=0, length=READ_CHUNK))

        async def chunks() -> AsyncIterator[bytes]:
            data = base64.b64decode(first.data)
            yield data
            offset, eof = len(data), first.eof
            while not eof:
                async with self.service.guest(ref) as channel:
                    part = await channel.call(P.ReadFile(path=path, offset=offset, length=READ_CHUNK))
                data = base64.b64decode(part.data)
                if not data:
                    break
                yield data
                offset += len(data)
                eof = part.eof

        return chunks()

    async def write_file(
        self, ref: str, path: str, data: bytes | AsyncIterator[bytes], mode: int = 0o644, owner: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> FileEntry:  # fmt: skip
        """Write ``data`` (bytes, or chunks as they arrive) atomically: the file appears whole or not at all.
        ``owner``: a user of the sandbox who owns it (and the parent directories it makes); else root.
        ``labels``: its user.e2b.* extended attributes (E2B's file metadata), set before any data is sent."""
        upload_id, offset, pending = secrets.token_hex(6), 0, bytearray()
        chunks = _single(data) if isinstance(data, bytes) else data
        async with self.service.guest(ref) as channel:

            async def send(part: bytes, final: bool) -> None:
                encoded = base64.b64encode(part).decode()
                op = P.WriteFile(path=path, data=encoded, offset=offset, final=final, upload_id=upload_id, mode=mode,
                                 owner=owner, labels=labels if offset == 0 else None)  # fmt: skip
                await channel.call(op, timeout=120)

            try:
                async for piece in chunks:
                    pending += piece
                    while len(pending) > FILE_CHUNK:  # keep the last chunk back: it is the final one
                        await send(bytes(pending[:FILE_CHUNK]), final=False)
                        offset += FILE_CHUNK
                        del pending[:FILE_CHUNK]
                await send(bytes(pending), final=True)
            except BaseException:
                if offset:  # chunks went in: their temp file goes now, not when the agent sweeps (an hour)
                    abort = P.WriteFile(path=path, upload_id=upload_id, abort=True)
                    with contextlib.suppress(Exception):
                        await asyncio.shield(channel.call(abort, timeout=30))
                raise
            return _entry(await channel.call(P.StatFile(path=path)))

    async def upload_dir(self, ref: str, path: str, tar: AsyncIterator[bytes], replace: bool) -> FileEntry:
        """A tar stream unpacked as directory ``path``: whole or not at all (checked member by member)."""
        archive = f"{DIR_TRANSFERS}/{secrets.token_hex(8)}.tar"
        try:
            await self.write_file(ref, archive, tar, mode=0o600)
        except BaseException:
            with contextlib.suppress(Exception):
                await self.delete_file(ref, archive, False)
            raise
        async with self.service.guest(ref) as channel:
            await channel.call(P.ExtractTar(archive=archive, path=path, replace=replace), timeout=600)
            return _entry(await channel.call(P.StatFile(path=path)))

    async def download_dir(self, ref: str, path: str) -> AsyncIterator[bytes]:
        """Directory ``path`` as a tar stream (packed in the sandbox first, so it is one instant's)."""
        archive = f"{DIR_TRANSFERS}/{secrets.token_hex(8)}.tar"

        async def remove() -> None:
            with contextlib.suppress(Exception):
                await self.delete_file(ref, archive, False)

        try:  # a pack cut off (timed out, the client gone) or a read that fails leaves no archive in the sandbox
            async with self.service.guest(ref) as channel:
                await channel.call(P.PackTar(path=path, archive=archive), timeout=600)
            chunks = await self.read_file(ref, archive)
        except BaseException:
            await asyncio.shield(remove())
            raise

        async def stream() -> AsyncIterator[bytes]:
            """One chunk behind the sandbox: the archive is removed once it is read whole, before the client has
            its last bytes (so nothing of it is left when the download returns), or when the client goes away."""
            last: bytes | None = None
            try:
                async for chunk in chunks:
                    if last is not None:
                        yield last
                    last = chunk
            except BaseException:
                await asyncio.shield(remove())
                raise
            await asyncio.shield(remove())
            if last is not None:
                yield last

        return stream()

    async def list_directory(self, ref: str, path: str) -> list[FileEntry]:
        async with self.service.guest(ref) as channel:
            listing = await channel.call(P.ListDir(path=path))
        return [_entry(e) for e in listing.entries]

    async def stat(self, ref: str, path: str) -> FileEntry:
        async with self.service.guest(ref) as channel:
            return _entry(await channel.call(P.StatFile(path=path)))

    async def delete_file(self, ref: str, path: str, recursive: bool) -> None:
        async with self.service.guest(ref) as channel:
            await channel.call(P.DeleteFile(path=path, recursive=recursive))

    async def mkdir(self, ref: str, path: str) -> FileEntry:
        async with self.service.guest(ref) as channel:
            await channel.call(P.MakeDir(path=path))
            return _entry(await channel.call(P.StatFile(path=path)))
