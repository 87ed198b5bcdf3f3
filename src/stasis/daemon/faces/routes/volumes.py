"""Volumes: create (empty, or a fork of a snapshot), list, change its size limit, remove, snapshot, list a
directory's files."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ....volume_models import (
    CreateVolumeRequest,
    SnapshotVolumeRequest,
    UpdateVolumeRequest,
    VolumeInfo,
    VolumeSnapshotInfo,
)
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.post("/v1/volumes", status_code=201)
async def create_volume(request: CreateVolumeRequest, rooms: RoomsDep, principal: PrincipalDep) -> VolumeInfo:
    return await rooms.volumes.create(request, principal.team)


@router.get("/v1/volumes")
async def volumes(rooms: RoomsDep, principal: PrincipalDep) -> list[VolumeInfo]:
    return await asyncio.to_thread(rooms.volumes.list, principal.team)


@router.get("/v1/volumes/{name}")
async def volume(name: str, rooms: RoomsDep) -> VolumeInfo:
    return await asyncio.to_thread(rooms.volumes.info, name)


@router.patch("/v1/volumes/{name}")
async def update_volume(
    name: str, request: UpdateVolumeRequest, rooms: RoomsDep, principal: PrincipalDep
) -> VolumeInfo:
    return await rooms.volumes.set_limit(name, request.max_size_mb, principal.team)


@router.delete("/v1/volumes/{name}")
async def remove_volume(name: str, rooms: RoomsDep) -> dict[str, str]:
    await rooms.volumes.remove(name)
    return {"removed": name}


@router.post("/v1/volumes/{name}/snapshots", status_code=201)
async def snapshot_volume(
    name: str, rooms: RoomsDep, request: SnapshotVolumeRequest | None = None
) -> VolumeSnapshotInfo:
    return await rooms.volumes.snapshot(name, (request or SnapshotVolumeRequest()).name)


@router.get("/v1/volume-snapshots")
async def volume_snapshots(
    rooms: RoomsDep, principal: PrincipalDep, volume: str | None = None
) -> list[VolumeSnapshotInfo]:
    found = await asyncio.to_thread(rooms.volumes.store.snapshots, volume)
    return [s for s in found if principal.sees(s.team)]


@router.delete("/v1/volume-snapshots/{ref}")
async def remove_volume_snapshot(ref: str, rooms: RoomsDep) -> dict[str, str]:
    await asyncio.to_thread(rooms.volumes.store.remove_snapshot, ref)
    return {"removed": ref}


@router.get("/v1/volumes/{name}/files")
async def volume_files(
    name: str, rooms: RoomsDep, path: Annotated[str, Query(max_length=4096)] = "/",
    depth: Annotated[int, Query(ge=1, le=32)] = 1,
) -> dict[str, Any]:  # fmt: skip
    return await rooms.volumes.files(name, path, depth)
