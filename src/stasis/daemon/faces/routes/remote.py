"""The remote store: what it holds, push, pull."""

from __future__ import annotations

from fastapi import APIRouter

from ....errors import Unsupported
from ....models import RemoteEntry, RemoteRequest, TransferResult
from ...rooms.remote import RemoteService
from ..deps import Rooms, RoomsDep

router = APIRouter()


def _remote(rooms: Rooms) -> RemoteService:
    if rooms.remote is None:
        raise Unsupported("no remote store is configured; start the daemon with STASIS_REMOTE=s3://bucket/prefix")
    return rooms.remote


@router.get("/v1/remote")
async def listing(rooms: RoomsDep) -> list[RemoteEntry]:
    """What the remote store holds: sandboxes (with their owner node) and checkpoints."""
    return await _remote(rooms).listing()


@router.post("/v1/remote/push")
async def push(request: RemoteRequest, rooms: RoomsDep) -> TransferResult:
    """Send a checkpoint, or a sandbox (suspended first), to the remote store; a sandbox leaves this node."""
    return await _remote(rooms).push(request.ref, request.kind)


@router.post("/v1/remote/pull")
async def pull(request: RemoteRequest, rooms: RoomsDep) -> TransferResult:
    """Fetch a checkpoint, or take a sandbox over (suspended), from the remote store."""
    return await _remote(rooms).pull(request.ref, request.kind)
