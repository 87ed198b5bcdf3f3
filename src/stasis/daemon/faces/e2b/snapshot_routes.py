"""E2B's snapshots: taken from a sandbox (full, or files only), listed, deleted; a sandbox is created from one by
naming it as its template."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from .plane import PlaneDep, Snapshot
from .template_routes import delete_built

router = APIRouter()


@router.post("/sandboxes/{sandbox_id}/snapshots", status_code=201)
async def snapshot(sandbox_id: str, plane: PlaneDep, body: Snapshot | None = None) -> dict[str, Any]:
    body = body or Snapshot()
    return plane.snapshot_info(await plane.room.snapshot(sandbox_id, body.name, body.memory))


@router.get("/snapshots")
async def snapshots(
    plane: PlaneDep,
    sandbox_id: Annotated[str | None, Query(alias="sandboxID")] = None,
    name: Annotated[str | None, Query(description="a snapshot's name or id (a ':tag' after it is ignored)")] = None,
) -> list[dict[str, Any]]:
    if sandbox_id is not None:
        sandbox_id = plane.room.sandbox(sandbox_id).id
    found = plane.room.snapshots(sandbox_id)
    if name is not None:
        wanted = name.rpartition("/")[2].partition(":")[0]  # E2B's [team/]name[:tag]: stasis has neither
        found = [c for c in found if wanted in (c.name, c.id)]
    return [plane.snapshot_info(c) for c in found]


@router.delete("/templates/{template_id}", status_code=204)
async def delete_snapshot(template_id: str, plane: PlaneDep) -> Response:
    """A template built through E2B's Template API, or a snapshot (E2B deletes both here)."""
    if not await delete_built(template_id, plane):
        plane.room.delete_snapshot(template_id)
    return Response(status_code=204)
