"""The code interpreter: Jupyter kernels in a sandbox (see ``..code``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from ...errors import InvalidRequest, StasisError
from ...models import CodeContextRequest, CodeRequest
from ..rooms import RoomsDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/code/execute")
async def execute(ref: str, request: CodeRequest, rooms: RoomsDep) -> StreamingResponse:
    """The execution's lines (stdout, stderr, result, error, ...) as JSON lines while it runs."""
    chunks = rooms.code.stream(ref, "POST", "/execute", request.model_dump(exclude_none=True))
    first = await anext(chunks, b"")  # errors (no such context, no Jupyter) become a proper HTTP error

    async def lines() -> AsyncIterator[bytes]:
        yield first
        try:
            async for chunk in chunks:
                yield chunk
        except StasisError as exc:
            yield b"\n" + json.dumps({"error": exc.to_payload()}).encode() + b"\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/v1/sandboxes/{ref}/code/contexts")
async def list_contexts(ref: str, rooms: RoomsDep) -> Any:
    return await rooms.code.call(ref, "GET", "/contexts")


@router.post("/v1/sandboxes/{ref}/code/contexts")
async def create_context(ref: str, request: CodeContextRequest, rooms: RoomsDep) -> Any:
    return await rooms.code.call(ref, "POST", "/contexts", request.model_dump(exclude_none=True))


@router.post("/v1/sandboxes/{ref}/code/contexts/{context_id}/restart")
async def restart_context(ref: str, context_id: str, rooms: RoomsDep) -> Any:
    return await rooms.code.call(ref, "POST", f"/contexts/{_id(context_id)}/restart", {})


@router.delete("/v1/sandboxes/{ref}/code/contexts/{context_id}")
async def remove_context(ref: str, context_id: str, rooms: RoomsDep) -> Any:
    return await rooms.code.call(ref, "DELETE", f"/contexts/{_id(context_id)}")


def _id(context_id: str) -> str:
    if not context_id.replace("-", "").isalnum() or len(context_id) > 64:
        raise InvalidRequest(f"not a context id: {context_id[:80]!r}")
    return context_id
