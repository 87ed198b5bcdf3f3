"""Exposed ports and SSH keys of a sandbox."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import Response

from ....models import ExposedPort, ExposePortRequest, SshHostKey, SshKeysRequest
from ...rooms import ssh
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/ports", status_code=201)
async def expose_port(ref: str, request: ExposePortRequest, rooms: RoomsDep) -> ExposedPort:
    return await rooms.ports.expose(ref, request)


@router.get("/v1/sandboxes/{ref}/ports")
async def list_ports(ref: str, rooms: RoomsDep) -> list[ExposedPort]:
    return rooms.ports.list(ref)


@router.delete("/v1/sandboxes/{ref}/ports/{port}", status_code=204)
async def unexpose_port(ref: str, port: Annotated[int, Path(ge=1, le=65535)], rooms: RoomsDep) -> Response:
    await rooms.ports.unexpose(ref, port)
    return Response(status_code=204)


@router.get("/v1/sandboxes/{ref}/ssh/host-key")
async def ssh_host_key(ref: str, rooms: RoomsDep) -> SshHostKey:
    return SshHostKey(public_key=await ssh.host_key(rooms.core, rooms.host_keys, ref))


@router.post("/v1/sandboxes/{ref}/ssh/keys", status_code=204)
async def ssh_authorize(ref: str, request: SshKeysRequest, rooms: RoomsDep) -> Response:
    await ssh.authorize(rooms.core, ref, request.public_keys)
    return Response(status_code=204)
