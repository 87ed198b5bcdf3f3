"""Secrets: added, rotated, listed and removed here; no read ever returns a value. A team's key reaches its team's
store; the owner reaches the owner's."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ....credentials.models import SecretInfo, SecretRequest
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.put("/v1/secrets/{name}")
async def put_secret(
    name: str, request: SecretRequest, rooms: RoomsDep, response: Response, principal: PrincipalDep
) -> SecretInfo:
    """Add a secret, or rotate it: sandboxes that use it send the new value from their next request."""
    info, existed = rooms.secrets.put(name, request, principal.team)
    response.status_code = 200 if existed else 201
    return info


@router.get("/v1/secrets")
async def list_secrets(rooms: RoomsDep, principal: PrincipalDep) -> list[SecretInfo]:
    return rooms.secrets.list(principal.team)


@router.get("/v1/secrets/{name}")
async def get_secret(name: str, rooms: RoomsDep, principal: PrincipalDep) -> SecretInfo:
    return rooms.secrets.get(name, principal.team)


@router.delete("/v1/secrets/{name}")
async def remove_secret(name: str, rooms: RoomsDep, principal: PrincipalDep) -> SecretInfo:
    """Its placeholders in sandboxes become inert: the proxy no longer puts anything in their place."""
    return rooms.secrets.remove(name, principal.team)
