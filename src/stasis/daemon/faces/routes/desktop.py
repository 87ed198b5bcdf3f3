"""A sandbox's desktop: its screen as PNG, and actions on it (mouse, keyboard, the browser)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ....desktop.actions import DesktopAction
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/sandboxes/{ref}/desktop", status_code=204)
async def start_desktop(ref: str, rooms: RoomsDep) -> Response:
    """Its session running (started if it was not): what a create of the desktop image does by itself."""
    await rooms.desktop.ensure(rooms.core.lookup(ref).id)
    return Response(status_code=204)


@router.get("/v1/sandboxes/{ref}/desktop/screenshot", response_class=Response)
async def screenshot(ref: str, rooms: RoomsDep) -> Response:
    return Response(await rooms.desktop.screenshot(ref), media_type="image/png")


@router.post("/v1/sandboxes/{ref}/desktop/actions", status_code=204)
async def act(ref: str, action: DesktopAction, rooms: RoomsDep) -> Response:
    await rooms.desktop.act(ref, action)
    return Response(status_code=204)
