"""Checkpoints: take one of a sandbox, list, read, fork into new sandboxes, delete."""

from __future__ import annotations

from fastapi import APIRouter

from ....models import CheckpointInfo, CreateCheckpointRequest, ForkRequest, SandboxInfo
from ...rooms import forks
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/checkpoints", status_code=201)
async def checkpoint(ref: str, request: CreateCheckpointRequest, rooms: RoomsDep) -> CheckpointInfo:
    return await rooms.checkpoints.take(ref, request)


@router.get("/v1/checkpoints")
async def list_checkpoints(rooms: RoomsDep, principal: PrincipalDep) -> list[CheckpointInfo]:
    return [c for c in rooms.checkpoints.list() if principal.sees(c.spec.team)]


@router.get("/v1/checkpoints/{ref}")
async def get_checkpoint(ref: str, rooms: RoomsDep) -> CheckpointInfo:
    return rooms.checkpoints.get(ref)


@router.post("/v1/checkpoints/{ref}/fork", status_code=201)
async def fork_checkpoint(ref: str, request: ForkRequest, rooms: RoomsDep) -> list[SandboxInfo]:
    """Rollouts: ``times`` sandboxes from one checkpoint, each going on from its instant (all or none)."""
    return await forks.fork_checkpoint(rooms.core, rooms.checkpoints, rooms.front, ref, request.times)


@router.delete("/v1/checkpoints/{ref}")
async def delete_checkpoint(ref: str, rooms: RoomsDep) -> CheckpointInfo:
    return rooms.checkpoints.delete(ref)
