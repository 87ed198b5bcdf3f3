"""Warm pools."""

from __future__ import annotations

from fastapi import APIRouter

from ....pool_models import CreatePoolRequest, PoolInfo
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/pools", status_code=201)
async def create_pool(request: CreatePoolRequest, rooms: RoomsDep) -> PoolInfo:
    return await rooms.pools.create(request)


@router.get("/v1/pools")
async def list_pools(rooms: RoomsDep) -> list[PoolInfo]:
    return rooms.pools.list()


@router.get("/v1/pools/{name}")
async def get_pool(name: str, rooms: RoomsDep) -> PoolInfo:
    return rooms.pools.describe(name)


@router.delete("/v1/pools/{name}")
async def remove_pool(name: str, rooms: RoomsDep) -> PoolInfo:
    return await rooms.pools.remove(name)
