"""Webhooks (the daemon owner's): lifecycle events posted to a URL, signed; their deliveries and attempts."""

from __future__ import annotations

from fastapi import APIRouter, Query

from ....webhook_models import AttemptInfo, CreatedWebhook, CreateWebhookRequest, DeliveryInfo, WebhookInfo
from ..deps import RoomsDep

router = APIRouter()


@router.post("/v1/webhooks", status_code=201)
async def add(request: CreateWebhookRequest, rooms: RoomsDep) -> CreatedWebhook:
    """A new webhook; its signing secret is in this answer only."""
    return await rooms.webhooks.add(request)


@router.get("/v1/webhooks")
async def webhooks(rooms: RoomsDep) -> list[WebhookInfo]:
    return rooms.webhooks.list()


@router.get("/v1/webhooks/{hook_id}")
async def webhook(hook_id: str, rooms: RoomsDep) -> WebhookInfo:
    return rooms.webhooks.get(hook_id)


@router.delete("/v1/webhooks/{hook_id}")
async def remove(hook_id: str, rooms: RoomsDep) -> dict[str, str]:
    rooms.webhooks.remove(hook_id)
    return {"removed": hook_id}


@router.get("/v1/webhooks/{hook_id}/deliveries")
async def deliveries(hook_id: str, rooms: RoomsDep, limit: int = Query(100, ge=1, le=1000)) -> list[DeliveryInfo]:
    """The newest deliveries first: status, attempts, the receiver's last answer and how long it took."""
    return rooms.webhooks.deliveries(hook_id, limit)


@router.get("/v1/webhook-deliveries/{delivery_id}/attempts")
async def attempts(delivery_id: str, rooms: RoomsDep) -> list[AttemptInfo]:
    return rooms.webhooks.attempts(delivery_id)


@router.post("/v1/webhook-deliveries/{delivery_id}/redeliver", status_code=202)
async def redeliver(delivery_id: str, rooms: RoomsDep) -> dict[str, str]:
    rooms.webhooks.redeliver(delivery_id)
    return {"redelivering": delivery_id}
