"""Usage (per sandbox and per team; a team's key sees its own) and the audit log (the owner's)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Query

from ....team_models import UsageReport
from ...rooms.accounting import usage
from ...rooms.audit import AuditEntry
from ..deps import RoomsDep
from ..tenancy import PrincipalDep

router = APIRouter()


@router.get("/v1/usage")
async def usage_report(
    rooms: RoomsDep, principal: PrincipalDep, team: str | None = None,
    since: float | None = Query(None, description="unix time; default: 24 hours ago"),
) -> UsageReport:  # fmt: skip
    """Per sandbox and per team: seconds running and suspended, CPU-seconds burnt (and allocated), memory
    GiB-seconds (allocated), disk and checkpoint GiB-hours, egress and ingress bytes."""
    only = principal.team if principal.team is not None else team
    start = since if since is not None else time.time() - 86400
    return await asyncio.to_thread(usage, rooms.core, rooms.checkpoints, rooms.meter, start, only, only is not None)


@router.get("/v1/audit")
async def audit(
    rooms: RoomsDep, after: int = 0, team: str | None = None, limit: int = Query(1000, ge=1, le=10000)
) -> list[AuditEntry]:
    """Who did what to which resource, when, from where, with what result; ``after``: the last seq seen."""
    return await asyncio.to_thread(rooms.audit.entries, after, team, limit)
