"""A resident server of a sandbox: a named background process the daemon starts once and talks to over a port
(the code interpreter's kernel server, the desktop's session). Being a process of the sandbox, it is suspended,
checkpointed, forked and moved with it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import time
from collections.abc import Callable

from ...errors import Unsupported
from ...models import StartProcessRequest
from ..core.service import SandboxService
from .operations import GuestOperations
from .ports import Ports

log = logging.getLogger(__name__)

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Resident:
    """One kind of resident server: found on its port, or started (once, however many ask at the same time) and
    waited for until it answers, or until it exits, which is said as ``exited(what it said)``."""

    def __init__(
        self, core: SandboxService, ports: Ports, ops: GuestOperations, *, name: str, port: int, what: str,
        argv: Callable[[str], list[str]], exited: Callable[[str], str], start_timeout: float,
    ) -> None:  # fmt: skip
        self.core, self.ports, self.ops = core, ports, ops
        self.name, self.port, self.what = name, port, what
        self.argv, self.exited, self.start_timeout = argv, exited, start_timeout
        self._starting: dict[str, asyncio.Lock] = {}

    async def connect(self, sandbox_id: str, port: int | None = None) -> Stream:
        """A connection to the server (or to another ``port`` its process serves), started first if need be."""
        with contextlib.suppress(ConnectionRefusedError):
            return await self.ports.open(sandbox_id, port or self.port)
        async with self._starting.setdefault(sandbox_id, asyncio.Lock()):  # concurrent first calls start one
            process_id = await running_or_started(self.ops, sandbox_id, self.name, self.argv(sandbox_id))
            deadline = time.monotonic() + self.start_timeout
            while True:
                try:
                    return await self.ports.open(sandbox_id, port or self.port)
                except ConnectionRefusedError:
                    if (said := await exit_said(self.ops, sandbox_id, process_id)) is not None:
                        raise Unsupported(self.exited(said)) from None
                    if time.monotonic() > deadline:
                        raise Unsupported(
                            f"{self.what} in sandbox {sandbox_id} did not answer within {self.start_timeout:g}s; "
                            f"`stasis logs {sandbox_id} {process_id}` shows what it said"
                        ) from None
                    await asyncio.sleep(0.2)

    async def ensure(self, sandbox_id: str) -> None:
        """The server answering, started if it was not."""
        _, writer = await self.connect(sandbox_id)
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def forget(self, sandbox_id: str) -> None:
        self._starting.pop(sandbox_id, None)


async def running_or_started(ops: GuestOperations, sandbox_id: str, name: str, argv: list[str]) -> str:
    """The id of the running process named ``name``-*, started now (from ``argv``) unless one runs."""
    for process in await ops.list_processes(sandbox_id):
        if (process.name or "").startswith(name) and process.status == "running":
            return process.id
    started = await ops.start_process(sandbox_id, StartProcessRequest(cmd=argv, name=f"{name}-{secrets.token_hex(3)}"))
    log.info("started %s in %s (%s)", name, sandbox_id, started.id)
    return started.id


async def exit_said(ops: GuestOperations, sandbox_id: str, process_id: str) -> str | None:
    """None while the process runs; once it ended, the last line it wrote on stderr (or its exit code)."""
    process = await ops.get_process(sandbox_id, process_id)
    if process.status == "running":
        return None
    output = await ops.process_output(sandbox_id, process_id, "stderr", 0, 1 << 16, 0)
    said = base64.b64decode(output.data_b64).decode(errors="replace").strip().splitlines()
    return said[-1] if said else f"exit {process.exit_code}"
