"""The Agents SDK's interactive commands (``exec_command`` that outlives its yield time, ``write_stdin``) as
stasis background processes: a command still running when its yield time is up keeps running, and the
model polls it or writes to it by its session id, as with the SDK's E2B and Docker providers.

stasis processes have pipes, not a terminal: ``tty=True`` gives the command a stdin to write to, and its
stdout and stderr in one stream, but ``isatty()`` is false inside (a REPL wants ``python3 -i``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import deque
from dataclasses import dataclass, field

from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PTY_PROCESSES_MAX,
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)

from ..errors import StasisError
from ..sdk import AsyncSandbox

OUTPUT_WAIT = 5.0  # seconds a long poll of a process's output waits for more
WRITE_SETTLE = 0.1  # as the E2B provider: let the command answer what was written before reading


@dataclass
class PtyProcess:
    """One running command: its stasis process and the output not yet given to the model."""

    process_id: str
    tty: bool
    chunks: deque[bytes] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float = field(default_factory=time.monotonic)
    exit_code: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class PtyProcesses:
    """The session's table of interactive commands, numbered as the SDK numbers them."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self.sandbox = sandbox
        self.processes: dict[int, PtyProcess] = {}
        self.reserved: set[int] = set()
        self.lock = asyncio.Lock()

    async def start(
        self, argv: list[str], *, env: dict[str, str], cwd: str | None, user: str | None, tty: bool,
        timeout: float | None, yield_time_s: float | None, max_output_tokens: int | None,
    ) -> PtyExecUpdate:  # fmt: skip
        options = {
            "env": env,
            "stdin": tty,
            **({"working_dir": cwd} if cwd else {}),
            **({"user": user} if user else {}),
        }
        info = await self.sandbox.start_process(argv, **options)  # type: ignore[arg-type]
        entry = PtyProcess(info.id, tty)
        streams = ("stdout", "stderr")
        entry.tasks = [asyncio.create_task(self._follow(entry, stream)) for stream in streams]
        entry.tasks.append(asyncio.create_task(self._wait(entry, timeout)))
        async with self.lock:
            number = allocate_pty_process_id(self.reserved)
            self.reserved.add(number)
            pruned = self._prune()
            self.processes[number] = entry
        if pruned is not None:
            await self._end(pruned)
        wait_ms = clamp_pty_yield_time_ms(10_000 if yield_time_s is None else int(yield_time_s * 1000))
        return await self._update(number, entry, wait_ms, max_output_tokens)

    async def write(
        self, number: int, chars: str, yield_time_s: float | None, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        from agents.sandbox.errors import PtySessionNotFoundError

        async with self.lock:
            entry = self.processes.get(number)
        if entry is None:
            raise PtySessionNotFoundError(session_id=number)
        if chars:
            if not entry.tty:
                raise RuntimeError("stdin is not available for this process")
            await self.sandbox.write_stdin(entry.process_id, chars.encode())
            await asyncio.sleep(WRITE_SETTLE)
        wait_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=wait_ms, input_empty=chars == "")
        entry.last_used = time.monotonic()
        return await self._update(number, entry, wait_ms, max_output_tokens)

    async def end_all(self) -> None:
        async with self.lock:
            entries = list(self.processes.values())
            self.processes.clear()
            self.reserved.clear()
        for entry in entries:
            await self._end(entry)

    async def _update(
        self, number: int, entry: PtyProcess, wait_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.chunks, output_lock=entry.lock, output_notify=entry.notify,
            is_done=entry.closed.is_set, yield_time_ms=wait_ms, max_output_tokens=max_output_tokens,
        )  # fmt: skip
        if not closed:
            return PtyExecUpdate(process_id=number, output=output, exit_code=None, original_token_count=tokens)
        async with self.lock:
            self.processes.pop(number, None)
            self.reserved.discard(number)
        await self._end(entry)
        return PtyExecUpdate(process_id=None, output=output, exit_code=entry.exit_code, original_token_count=tokens)

    async def _follow(self, entry: PtyProcess, stream: str) -> None:
        offset = 0
        while True:
            chunk = await self.sandbox.process_output(entry.process_id, stream=stream, offset=offset, wait=OUTPUT_WAIT)
            if data := base64.b64decode(chunk.data_b64):
                async with entry.lock:
                    entry.chunks.append(data)
                entry.notify.set()
            if chunk.eof:
                if chunk.exit_code is not None:
                    entry.exit_code = chunk.exit_code
                return
            offset = chunk.next_offset

    async def _wait(self, entry: PtyProcess, timeout: float | None) -> None:
        """Until both streams ended: then the exit code, and the entry closed (a timeout kills it first)."""
        followers = entry.tasks[:2]
        try:
            await asyncio.wait_for(asyncio.gather(*followers), timeout)
        except TimeoutError:
            with contextlib.suppress(StasisError):
                await self.sandbox.kill_process(entry.process_id)
            await asyncio.gather(*followers, return_exceptions=True)
        except StasisError:
            pass  # the sandbox went away: the process's code, if any, is below
        for _ in range(600):  # the output ended; the exit is reaped a moment later
            if entry.exit_code is not None:
                break
            try:
                entry.exit_code = (await self.sandbox.get_process(entry.process_id)).exit_code
            except StasisError:
                entry.exit_code = -1
            if entry.exit_code is None:
                await asyncio.sleep(0.1)
        if entry.exit_code is None:
            entry.exit_code = -1
        async with entry.lock:
            pass  # output appended before the close is collected with it
        entry.closed.set()
        entry.notify.set()

    async def _end(self, entry: PtyProcess) -> None:
        if not entry.closed.is_set():
            with contextlib.suppress(StasisError):
                await self.sandbox.kill_process(entry.process_id)
        for task in entry.tasks:
            task.cancel()
        await asyncio.gather(*entry.tasks, return_exceptions=True)

    def _prune(self) -> PtyProcess | None:
        if len(self.processes) < PTY_PROCESSES_MAX:
            return None
        meta = [(n, e.last_used, e.closed.is_set()) for n, e in self.processes.items()]
        number = process_id_to_prune_from_meta(meta)
        if number is None:
            return None
        self.reserved.discard(number)
        return self.processes.pop(number, None)
