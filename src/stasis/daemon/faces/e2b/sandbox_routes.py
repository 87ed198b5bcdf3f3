"""E2B's sandbox routes: create, list, get, kill, lifetimes, pause and connect, fork, network, metrics, logs."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from ....errors import InvalidRequest
from ....netpolicy import NetworkPolicy
from ..tenancy import PrincipalDep
from .plane import (
    Connect,
    Fork,
    NetworkConfig,
    NewSandbox,
    Pause,
    PlaneDep,
    Timeout,
    egress_headers,
    error,
    iso,
    policy,
)
from .room import PAUSED

log = logging.getLogger(__name__)
router = APIRouter()


@router.post("/sandboxes", status_code=201)
@router.post("/v2/sandboxes", status_code=201)
async def create(body: NewSandbox, plane: PlaneDep, principal: PrincipalDep) -> dict[str, Any]:
    public = bool(body.network and body.network.allow_public_traffic)
    network = policy(body.allow_internet_access, body.network)
    info, record = await plane.room.create(
        plane.defaults, body.template_id, body.timeout, body.auto_pause, body.metadata, body.env_vars,
        network, public, egress_headers(body.network), keep_memory=body.auto_pause_memory, volumes=body.volume_mounts,
        team=principal.team,
    )  # fmt: skip
    if network is not None and network.note:
        log.warning("E2B sandbox %s: %s", info.id, network.note)
    return plane.created(info, record)


@router.get("/v2/sandboxes")
async def list_v2(
    plane: PlaneDep,
    principal: PrincipalDep,
    response: Response,
    metadata: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    next_token: Annotated[str | None, Query(alias="nextToken")] = None,
    order: Annotated[Literal["asc", "desc"], Query(description="by start time; E2B's default: newest first")] = "desc",
    started_after: Annotated[datetime | None, Query(alias="startedAfter")] = None,
    template: str | None = None,
) -> list[dict[str, Any]]:
    wanted = dict(parse_qsl(metadata)) if metadata else {}
    states = set(state.split(",")) if state else {"running", "paused"}
    if started_after is not None and started_after.tzinfo is None:
        started_after = started_after.replace(tzinfo=UTC)
    rows = [plane.listed(info, record) for info, record in plane.room.listing(principal.team)]
    rows = [r for r in rows if r["state"] in states and wanted.items() <= r["metadata"].items()
            and (template is None or template in (r["templateID"], r["alias"]))
            and (started_after is None or info_started(r) > started_after)]  # fmt: skip
    newest_first = order == "desc"
    rows.sort(key=lambda r: (r["startedAt"], r["sandboxID"]), reverse=newest_first)
    if next_token:
        after = tuple(next_token.split("|", 1))
        rows = [r for r in rows if ((r["startedAt"], r["sandboxID"]) < after) == newest_first
                and (r["startedAt"], r["sandboxID"]) != after]  # fmt: skip
    page = rows[:limit]
    if len(rows) > limit:
        response.headers["x-next-token"] = f"{page[-1]['startedAt']}|{page[-1]['sandboxID']}"
    return page


def info_started(row: dict[str, Any]) -> datetime:
    started = datetime.fromisoformat(row["startedAt"].replace("Z", "+00:00"))
    return started if started.tzinfo else started.replace(tzinfo=UTC)


@router.get("/sandboxes")
async def list_v1(plane: PlaneDep, principal: PrincipalDep, metadata: str | None = None) -> list[dict[str, Any]]:
    wanted = dict(parse_qsl(metadata)) if metadata else {}
    rows = [plane.listed(info, record) for info, record in plane.room.listing(principal.team)]
    return [r for r in rows if r["state"] == "running" and wanted.items() <= r["metadata"].items()]


@router.get("/sandboxes/{sandbox_id}")
async def get(sandbox_id: str, plane: PlaneDep) -> dict[str, Any]:
    info = plane.room.sandbox(sandbox_id)
    return plane.detail(info, plane.room.record(info))


@router.delete("/sandboxes/{sandbox_id}", status_code=204)
async def kill(sandbox_id: str, plane: PlaneDep) -> Response:
    await plane.room.kill(sandbox_id)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
async def set_timeout(sandbox_id: str, body: Timeout, plane: PlaneDep) -> Response:
    await plane.room.set_timeout(sandbox_id, body.timeout)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
async def refresh(sandbox_id: str, plane: PlaneDep, body: Connect | None = None) -> Response:
    await plane.room.set_timeout(sandbox_id, body.timeout if body and body.timeout is not None else 300)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/pause", status_code=204)
async def pause(sandbox_id: str, plane: PlaneDep, body: Pause | None = None) -> Response:
    if plane.room.sandbox(sandbox_id).status in PAUSED:
        return error(409, f"sandbox {sandbox_id} is already paused")
    await plane.room.pause(sandbox_id, keep_memory=body.memory if body else True)
    return Response(status_code=204)


@router.post("/sandboxes/{sandbox_id}/resume", status_code=201)
@router.post("/sandboxes/{sandbox_id}/connect")
@router.post("/v2/sandboxes/{sandbox_id}/connect")
async def connect(sandbox_id: str, plane: PlaneDep, body: Connect | None = None) -> JSONResponse:
    info, record, resumed = await plane.room.connect(sandbox_id, body.timeout if body else None)
    return JSONResponse(plane.created(info, record), status_code=201 if resumed else 200)


@router.post("/sandboxes/{sandbox_id}/fork", status_code=201)
async def fork(sandbox_id: str, body: Fork, plane: PlaneDep) -> list[dict[str, Any]]:
    children = await plane.room.fork(sandbox_id, body.count, body.timeout)
    return [{"sandbox": plane.created(info, record)} for info, record in children]


@router.put("/sandboxes/{sandbox_id}/network", status_code=204)
async def update_network(sandbox_id: str, body: NetworkConfig, plane: PlaneDep) -> Response:
    """E2B's rules replace the sandbox's. A body that would open the whole internet without saying so (``{}``,
    ``rules`` alone, an ``allowOut`` without ``denyOut``: E2B's meaning) is refused: a 204 could not say it."""
    updated = policy(True, body) or NetworkPolicy.no_egress()
    if body.deny_out is None and not updated.allow_out and not updated.deny_out:
        raise InvalidRequest(
            "this update would let the sandbox reach the whole internet (E2B's meaning of {}, of rules alone and of "
            "allowOut without denyOut); to allow only allowOut add denyOut ['0.0.0.0/0'], to open everything send "
            "denyOut [] explicitly"
        )
    info = await plane.room.update_network(sandbox_id, updated)
    if info.spec.network is not None and info.spec.network.note:
        log.warning("E2B sandbox %s: %s", info.id, info.spec.network.note)
    return Response(status_code=204)


@router.get("/sandboxes/{sandbox_id}/logs")
async def logs(sandbox_id: str, plane: PlaneDep) -> dict[str, Any]:
    """The sandbox's lifecycle journal (stasis' transitions: created, suspended, resumed...) as E2B's logs."""
    entries = plane.log_entries(plane.room.sandbox(sandbox_id).id)
    return {"logs": [{"timestamp": e["timestamp"], "line": e["message"]} for e in entries], "logEntries": entries}


@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def logs_v2(sandbox_id: str, plane: PlaneDep) -> dict[str, Any]:
    return {"logs": plane.log_entries(plane.room.sandbox(sandbox_id).id)}


@router.get("/sandboxes/{sandbox_id}/metrics")
async def metrics(
    sandbox_id: str, plane: PlaneDep, start: Annotated[int | None, Query(ge=0)] = None,
    end: Annotated[int | None, Query(ge=0)] = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One sample, taken now (stasis keeps no history of them), if now is in the range asked (unix seconds);
    none for a paused sandbox."""
    now = time.time()
    if (start is not None and now < start) or (end is not None and now > end + 1):  # a range in the past: no sample
        plane.room.sandbox(sandbox_id)  # still E2B's 404 for a sandbox that is not there
        return []
    sample = await plane.room.metrics(sandbox_id)
    if sample is None:
        return []
    return [{
        "timestamp": iso(now), "timestampUnix": int(now), "cpuCount": sample["cpu_count"],
        "cpuUsedPct": sample["cpu_used_pct"], "memUsed": sample["mem_used"], "memTotal": sample["mem_total"],
        "memCache": sample["mem_cache"], "diskUsed": sample["disk_used"], "diskTotal": sample["disk_total"],
    }]  # fmt: skip
