"""Long work the daemon does for a client (an image import or build) as a stream of JSON lines: each
``{"progress": LINE}`` as it happens, then ``{"result": ...}`` or ``{"error": {type, message, details}}``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from ...errors import StasisError

Work = Callable[[Callable[[str], None]], BaseModel]  # runs in a thread, reports progress through its argument


def streamed(work: Work, cleanup: Callable[[], None] = lambda: None) -> StreamingResponse:
    async def lines() -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def report(line: str) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, {"progress": line[:500]})

        task = loop.create_task(asyncio.to_thread(work, report))
        try:
            while not (task.done() and queue.empty()):
                getter = loop.create_task(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield json.dumps(getter.result()).encode() + b"\n"
                else:
                    getter.cancel()
            try:
                yield json.dumps({"result": task.result().model_dump(mode="json")}).encode() + b"\n"
            except StasisError as exc:
                yield json.dumps({"error": exc.to_payload()}).encode() + b"\n"
        finally:
            cleanup()

    return StreamingResponse(lines(), media_type="application/x-ndjson")
