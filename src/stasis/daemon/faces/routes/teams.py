"""Teams, their quotas and their keys (the owner's; a key with the admin scope manages its own team's keys), and
who a request's token or key stands for."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ....errors import Forbidden
from ....team_models import CreatedKey, CreateKeyRequest, CreateTeamRequest, ExportedKey, KeyInfo, TeamInfo, TeamQuotas
from ...rooms.teams import Principal
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.get("/v1/whoami")
async def whoami(principal: PrincipalDep) -> dict[str, Any]:
    """The owner (team None, every scope), or the team and scopes of the key sent."""
    return {"team": principal.team, "scopes": sorted(principal.scopes), "key_id": principal.key_id}


@router.post("/v1/teams", status_code=201)
async def create_team(request: CreateTeamRequest, rooms: RoomsDep) -> TeamInfo:
    return rooms.teams.create_team(request)


@router.get("/v1/teams")
async def teams(rooms: RoomsDep) -> list[TeamInfo]:
    return rooms.teams.teams()


@router.get("/v1/teams/{name}")
async def team(name: str, rooms: RoomsDep) -> TeamInfo:
    return rooms.teams.team(name)


@router.patch("/v1/teams/{name}")
async def set_quotas(name: str, quotas: TeamQuotas, rooms: RoomsDep) -> TeamInfo:
    """The quotas sent (null: no limit) set; those not sent kept."""
    return rooms.teams.set_quotas(name, quotas.model_dump(exclude_unset=True))


@router.delete("/v1/teams/{name}")
async def remove_team(name: str, rooms: RoomsDep) -> dict[str, str]:
    rooms.teams.remove_team(name)
    return {"removed": name}


@router.post("/v1/keys", status_code=201)
async def create_key(request: CreateKeyRequest, rooms: RoomsDep, principal: PrincipalDep) -> CreatedKey:
    """A new key of a team: the key itself is in this answer only."""
    return rooms.teams.create_key(request, principal)


@router.get("/v1/keys/export")
async def export_keys(rooms: RoomsDep, principal: PrincipalDep) -> list[ExportedKey]:
    """Every key with its secret's hash, never the secret (the owner's: a fleet's door copies them to a new node)."""
    _owner_only(principal)
    return rooms.teams.export_keys()


@router.post("/v1/keys/import")
async def import_keys(keys: list[ExportedKey], rooms: RoomsDep, principal: PrincipalDep) -> dict[str, int]:
    """Keys this daemon lacks added as exported elsewhere, and revocations applied (the owner's)."""
    _owner_only(principal)
    return {"changed": rooms.teams.import_keys(keys)}


def _owner_only(principal: Principal) -> None:
    if principal.team is not None:
        raise Forbidden("copying keys between daemons is the owner's")


@router.get("/v1/keys")
async def keys(rooms: RoomsDep, principal: PrincipalDep, team: str | None = None) -> list[KeyInfo]:
    return rooms.teams.keys(principal, team)


@router.delete("/v1/keys/{key_id}")
async def revoke_key(key_id: str, rooms: RoomsDep, principal: PrincipalDep) -> KeyInfo:
    return rooms.teams.revoke(key_id, principal)
