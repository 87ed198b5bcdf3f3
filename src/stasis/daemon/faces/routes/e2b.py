"""The E2B face's listener: opened for as long as the caller (`stasis e2b serve`) keeps this stream open."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from ....e2b_models import E2bServeRequest
from ..deps import RoomsDep
from ..e2b.room import Defaults

router = APIRouter()

HEARTBEAT = 15.0  # seconds between the lines that tell the caller the listener still stands


@router.post("/v1/e2b/serve")
async def serve(request: E2bServeRequest, rooms: RoomsDep) -> StreamingResponse:
    """JSON lines: first what to export (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) and the domain get_host names,
    then a heartbeat; the listener closes when the stream does."""
    defaults = Defaults(request.backend, request.memory_mb, request.cpus, request.build_network)
    listener = await rooms.e2b_listeners.open(request.listen, defaults, request.domain)

    async def lines() -> AsyncIterator[str]:
        try:
            exports = {**listener.exports, "E2B_API_KEY": rooms.e2b.keys.api_key}
            yield json.dumps({"listening": listener.url, "exports": exports, "domain": listener.domain}) + "\n"
            while True:
                await asyncio.sleep(HEARTBEAT)
                yield json.dumps({"alive": True}) + "\n"
        finally:
            with anyio.CancelScope(shield=True):  # the caller left: this runs in a cancelled scope
                await rooms.e2b_listeners.close(listener)

    return StreamingResponse(lines(), media_type="application/x-ndjson")
