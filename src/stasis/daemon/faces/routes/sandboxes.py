"""Sandboxes: create (through the front desk), list, read, suspend, resume, fork, remove, their network."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Query

from ....errors import NameTaken, SandboxNotFound, StasisError, echo
from ....models import CreateSandboxRequest, ForkRequest, RemoveRequest, RemoveResult, SandboxInfo
from ....netpolicy import NetworkPolicy
from ...rooms.forks import fork as fork_sandbox
from ..deps import Rooms, RoomsDep
from ..tenancy import PrincipalDep, missing

router = APIRouter()
log = logging.getLogger(__name__)
REMOVING_AT_ONCE = 8


@router.post("/v1/sandboxes", status_code=201)
async def create(request: CreateSandboxRequest, rooms: RoomsDep, principal: PrincipalDep) -> SandboxInfo:
    if principal.team is not None:  # a key's sandbox is its team's, whatever the request says
        request = request.model_copy(update={"team": principal.team})
    elif request.team is not None:
        rooms.teams.team(request.team)  # the owner may make one for a team that exists
    try:
        return await rooms.front.create(request)
    except NameTaken:
        if principal.team is None or _named_by(rooms, request.name) in (principal.team, "?"):
            raise
        # the name is held outside the team: saying whose, or how to remove it, would tell of another tenant
        raise NameTaken(f"the name {echo(request.name or '')} cannot be used here; pick another") from None


def _named_by(rooms: Rooms, name: str | None) -> str | None:
    """The team whose live sandbox has this name (None: the owner's; "?": none now)."""
    try:
        return rooms.core.lookup(name or "").spec.team
    except SandboxNotFound:
        return "?"


@router.get("/v1/sandboxes")
async def list_sandboxes(
    rooms: RoomsDep,
    principal: PrincipalDep,
    all: bool = False,
    limit: Annotated[int | None, Query(ge=1, le=1000, description="at most this many (a page)")] = None,
    after: Annotated[str | None, Query(description="the id of the last sandbox of the previous page")] = None,
) -> list[SandboxInfo]:
    cursor = None
    if after is not None:
        try:
            last = rooms.core.record(after)
        except SandboxNotFound:
            if principal.team is None:
                raise
            raise missing("sandbox", after) from None
        if not principal.sees(last.spec.team) or (principal.team is not None and last.pool is not None):
            raise missing("sandbox", after)
        cursor = (last.created_at, last.id)
    if principal.team is None:
        return rooms.core.list(include_terminated=all, limit=limit, after=cursor)
    theirs = [i for i in rooms.core.list(include_terminated=all, after=cursor) if i.spec.team == principal.team]
    return theirs[:limit]


@router.post("/v1/sandboxes/remove")
async def remove_many(request: RemoveRequest, rooms: RoomsDep, principal: PrincipalDep) -> RemoveResult:
    """Every sandbox named, removed at once (a few at a time); one that cannot be is said, the rest still go."""
    limit = asyncio.Semaphore(REMOVING_AT_ONCE)

    async def remove(ref: str) -> SandboxInfo:
        if principal.team is not None:
            try:
                theirs = rooms.core.lookup(ref).spec.team == principal.team
            except SandboxNotFound:
                theirs = False
            if not theirs:
                raise missing("sandbox", ref)
        async with limit:
            return await rooms.core.terminate(ref)

    refs = list(dict.fromkeys(request.refs))
    results = await asyncio.gather(*(remove(ref) for ref in refs), return_exceptions=True)
    failed = {}
    for ref, outcome in zip(refs, results, strict=True):
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, StasisError):  # said with the rest: the ones removed stay reported
                log.error("removing %s failed", ref, exc_info=outcome)
            failed[ref] = str(outcome) or type(outcome).__name__
    return RemoveResult(removed=[r.id for r in results if isinstance(r, SandboxInfo)], failed=failed)


@router.get("/v1/sandboxes/{ref}")
async def get(ref: str, rooms: RoomsDep) -> SandboxInfo:
    return rooms.core.get(ref)


@router.delete("/v1/sandboxes/{ref}")
async def terminate(ref: str, rooms: RoomsDep) -> SandboxInfo:
    return await rooms.core.terminate(ref)


@router.post("/v1/sandboxes/{ref}/suspend")
async def suspend(ref: str, rooms: RoomsDep, keep_memory: bool | None = None) -> SandboxInfo:
    """``keep_memory=false``: its files only (a stop; the next resume boots it again); default: its spec's."""
    return await rooms.core.suspend(ref, keep_memory=keep_memory)


@router.post("/v1/sandboxes/{ref}/resume")
async def resume(ref: str, rooms: RoomsDep, principal: PrincipalDep) -> SandboxInfo:
    return await rooms.front.resume(ref, principal.team)


@router.post("/v1/sandboxes/{ref}/fork", status_code=201)
async def fork(ref: str, request: ForkRequest, rooms: RoomsDep) -> list[SandboxInfo]:
    return await fork_sandbox(rooms.core, rooms.checkpoints, ref, request.times)


@router.get("/v1/sandboxes/{ref}/transitions")
async def transitions(ref: str, rooms: RoomsDep) -> list[dict]:
    return rooms.core.journal(rooms.core.get(ref).id)


@router.put("/v1/sandboxes/{ref}/network")
async def network(ref: str, policy: NetworkPolicy, rooms: RoomsDep) -> SandboxInfo:
    return await rooms.core.set_network(ref, policy)
