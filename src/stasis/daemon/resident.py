"""A resident server of a sandbox: a named background process the daemon starts once and talks to over a port
(the code interpreter's kernel server, the desktop's session). Being a process of the sandbox, it is suspended,
checkpointed, forked and moved with it."""

from __future__ import annotations

import base64
import logging
import secrets

from ..models import StartProcessRequest
from .operations import GuestOperations

log = logging.getLogger(__name__)


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
