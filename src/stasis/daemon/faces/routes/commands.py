"""Commands in a sandbox: run to completion, streamed, or as background processes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response, StreamingResponse

from ....errors import StasisError
from ....models import (
    ProcessInfo,
    ProcessOutput,
    RunRequest,
    RunResult,
    SignalRequest,
    StartProcessRequest,
    StdinRequest,
)  # fmt: skip
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/exec")
async def run(ref: str, request: RunRequest, rooms: RoomsDep) -> RunResult:
    return await rooms.ops.run(ref, request)


@router.post("/v1/sandboxes/{ref}/exec/stream")
async def run_stream(
    ref: str,
    request: RunRequest,
    rooms: RoomsDep,
    kill_on_disconnect: Annotated[bool, Query(description="a client gone before the exit takes the command "
                                              "and its children with it, as ssh does; else it runs on")] = False,
) -> StreamingResponse:  # fmt: skip
    """The command's output as JSON lines while it runs; the last line has its exit code."""
    events = rooms.ops.run_stream(ref, request)
    first = await anext(events)  # errors (unknown sandbox, bad cwd) become a proper HTTP error

    async def lines() -> AsyncIterator[bytes]:
        try:
            yield json.dumps(first).encode() + b"\n"
            async for event in events:
                yield json.dumps(event).encode() + b"\n"
        except StasisError as exc:
            yield json.dumps({"error": exc.to_payload()}).encode() + b"\n"
        except (asyncio.CancelledError, GeneratorExit):  # the client went away before the exit
            if kill_on_disconnect:
                rooms.ops.kill_left_behind(ref, first["exec_id"])
            raise

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@router.get("/v1/sandboxes/{ref}/exec/{exec_id}")
async def exec_status(ref: str, exec_id: str, rooms: RoomsDep) -> dict:
    return await rooms.ops.exec_status(ref, exec_id)


@router.post("/v1/sandboxes/{ref}/processes", status_code=201)
async def start_process(ref: str, request: StartProcessRequest, rooms: RoomsDep) -> ProcessInfo:
    return await rooms.ops.start_process(ref, request)


@router.get("/v1/sandboxes/{ref}/processes")
async def list_processes(ref: str, rooms: RoomsDep) -> list[ProcessInfo]:
    return await rooms.ops.list_processes(ref)


@router.get("/v1/sandboxes/{ref}/processes/{process_id}")
async def get_process(ref: str, process_id: str, rooms: RoomsDep) -> ProcessInfo:
    return await rooms.ops.get_process(ref, process_id)


@router.get("/v1/sandboxes/{ref}/processes/{process_id}/output")
async def process_output(
    ref: str,
    process_id: str,
    rooms: RoomsDep,
    stream: Annotated[str, Query(pattern="^(stdout|stderr)$")] = "stdout",
    offset: Annotated[int, Query(ge=0, le=1 << 62)] = 0,
    max_bytes: Annotated[int, Query(ge=1, le=4 << 20)] = 1 << 20,
    wait: Annotated[float, Query(ge=0, le=300)] = 0,
) -> ProcessOutput:
    return await rooms.ops.process_output(ref, process_id, stream, offset, max_bytes, wait)


@router.post("/v1/sandboxes/{ref}/processes/{process_id}/signal")
async def signal_process(ref: str, process_id: str, request: SignalRequest, rooms: RoomsDep) -> ProcessInfo:
    return await rooms.ops.signal_process(ref, process_id, request.signal)


@router.post("/v1/sandboxes/{ref}/processes/{process_id}/stdin", status_code=204)
async def write_stdin(ref: str, process_id: str, request: StdinRequest, rooms: RoomsDep) -> Response:
    await rooms.ops.write_stdin(ref, process_id, request.data_b64, request.close)
    return Response(status_code=204)
