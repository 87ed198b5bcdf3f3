"""The egress audit of a sandbox: every connection it opened, allowed or denied (``network.audit``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ....network.audit import NAME, read_lines
from ..deps import RoomsDep

router = APIRouter()
FOLLOW_POLL = 0.5  # seconds between looks at the file while following


@router.get("/v1/sandboxes/{ref}/egress", response_model=None)
async def egress(ref: str, rooms: RoomsDep, request: Request, follow: bool = False) -> Any:
    """Every kept line, oldest first; ``follow``: then each new one as it is written (JSON lines)."""
    info = rooms.core.lookup(ref)
    audit = rooms.core.egress_audit
    if audit is None:
        return []
    if not follow:
        return list(audit.lines(info.id))
    path = audit.path(info.id)

    async def lines() -> AsyncIterator[bytes]:
        for line in audit.lines(info.id):
            yield json.dumps(line).encode() + b"\n"
        offset = path.stat().st_size if path.exists() else 0
        while not await request.is_disconnected():
            if path.exists() and path.stat().st_size < offset:
                offset = 0  # rotated: the new file starts over
            found, offset = read_lines(path, offset)
            for line in found:
                yield json.dumps(line).encode() + b"\n"
            await asyncio.sleep(FOLLOW_POLL)

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"x-audit-file": NAME})
