"""E2B's secrets, as stasis' own: created, listed, updated and deleted here; no answer carries a value.

E2B binds a secret to hosts per sandbox (a network rule's header transform naming ``${e2b.secrets.NAME}``), not
per secret, so a secret made here is bound to no host: only a sandbox's rules send it (``egress_headers``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import Field

from ....credentials.models import SecretInfo, SecretRequest
from ....errors import Conflict
from .plane import PlaneDep, _Body, iso

router = APIRouter()
ID_PREFIX = "sec_"


class NewSecret(_Body):
    name: str = Field(min_length=1, max_length=128)
    value: str = Field(repr=False)
    metadata: dict[str, str] = Field(default_factory=dict)


class SecretUpdate(_Body):
    value: str = Field(repr=False)
    metadata: dict[str, str] | None = None


def shown(info: SecretInfo) -> dict[str, Any]:
    return {"secretID": ID_PREFIX + info.name, "name": info.name, "currentVersion": info.version,
            "metadata": info.metadata, "createdAt": iso(info.created_at),
            "updatedAt": iso(info.updated_at)}  # fmt: skip


def name_of(secret_id: str) -> str:
    """E2B names a secret by its id or its name; names are lower-cased."""
    return secret_id.removeprefix(ID_PREFIX).lower()


@router.post("/secrets", status_code=201)
async def create(body: NewSecret, plane: PlaneDep) -> dict[str, Any]:
    secrets = plane.room.secrets
    name = body.name.lower()
    if any(s.name == name for s in secrets.list()):
        raise Conflict(f"a secret named {name!r} exists; update it with POST /secrets/{ID_PREFIX}{name}")
    info, _ = secrets.put(name, SecretRequest(value=body.value, metadata=body.metadata))
    return shown(info)


@router.get("/secrets")
async def listing(
    plane: PlaneDep,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
) -> list[dict[str, Any]]:
    names = [info for info in plane.room.secrets.list() if next_token is None or info.name > next_token]
    page = names[:limit]
    if len(names) > limit:
        response.headers["x-next-token"] = page[-1].name
    return [shown(info) for info in page]


@router.get("/secrets/{secret_id}")
async def get(secret_id: str, plane: PlaneDep) -> dict[str, Any]:
    return shown(plane.room.secrets.get(name_of(secret_id)))


@router.post("/secrets/{secret_id}")
async def update(secret_id: str, body: SecretUpdate, plane: PlaneDep) -> dict[str, Any]:
    """A new version: what it is bound to stays; sandboxes send it from their next request."""
    secrets = plane.room.secrets
    old = secrets.get(name_of(secret_id))
    request = SecretRequest(value=body.value, hosts=old.hosts, header=old.header, format=old.format, body=old.body,
                            metadata=old.metadata if body.metadata is None else body.metadata)  # fmt: skip
    info, _ = secrets.put(old.name, request)
    return shown(info)


@router.delete("/secrets/{secret_id}", status_code=204)
async def delete(secret_id: str, plane: PlaneDep) -> Response:
    plane.room.secrets.remove(name_of(secret_id))
    return Response(status_code=204)
