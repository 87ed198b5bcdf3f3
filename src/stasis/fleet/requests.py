"""What the fleet's door holds of a request: its body only when small (a JSON request, or one it may have to
send again), never an upload."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from ..errors import InvalidRequest

REPLAYABLE = 1 << 20  # bytes of a request body the door holds (to send again after a stale lookup)


async def small_json(request: Request) -> Any:
    """A request's JSON body, refused past ``REPLAYABLE`` bytes before any of it is held."""
    if not replayable(request) and request.method != "GET":
        raise InvalidRequest(f"a request body to the fleet's door is at most {REPLAYABLE >> 20} MiB, with its length")
    try:
        return json.loads(await request.body() or b"null")
    except ValueError:
        raise InvalidRequest("the request's body is not JSON") from None


def replayable(request: Request) -> bool:
    """A body small enough to hold, so a request sent to a node that no longer has the sandbox can go again."""
    length = request.headers.get("content-length")
    chunked = "chunked" in request.headers.get("transfer-encoding", "")
    small = length is not None and length.isdigit() and int(length) <= REPLAYABLE
    return request.method in ("GET", "DELETE") or (not chunked and small)
