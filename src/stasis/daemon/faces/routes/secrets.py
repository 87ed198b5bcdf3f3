"""Secrets: added, rotated, listed and removed here; no read ever returns a value."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ....credentials.models import SecretInfo, SecretRequest
from ..deps import RoomsDep

router = APIRouter()


@router.put("/v1/secrets/{name}")
async def put_secret(name: str, request: SecretRequest, rooms: RoomsDep, response: Response) -> SecretInfo:
    """Add a secret, or rotate it: sandboxes that use it send the new value from their next request."""
    info, existed = rooms.secrets.put(name, request)
    response.status_code = 200 if existed else 201
    return info


@router.get("/v1/secrets")
async def list_secrets(rooms: RoomsDep) -> list[SecretInfo]:
    return rooms.secrets.list()


@router.get("/v1/secrets/{name}")
async def get_secret(name: str, rooms: RoomsDep) -> SecretInfo:
    return rooms.secrets.get(name)


@router.delete("/v1/secrets/{name}")
async def remove_secret(name: str, rooms: RoomsDep) -> SecretInfo:
    """Its placeholders in sandboxes become inert: the proxy no longer puts anything in their place."""
    return rooms.secrets.remove(name)
