"""The code interpreter: Jupyter kernels in a sandbox (see ``..code``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from ....code_models import CodeContextRequest, CodeRequest
from ....errors import InvalidRequest
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/code/execute")
async def execute(ref: str, request: CodeRequest, rooms: RoomsDep) -> StreamingResponse:
    """The execution's lines (stdout, stderr, result, error, ...) as JSON lines while it runs."""
    lines = await rooms.code.execute(ref, request, lambda exc: {"error": exc.to_payload()})
    return StreamingResponse(lines, media_type="application/x-ndjson")


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
