"""Webhooks through the daemon (the owner's): lifecycle events of sandboxes posted, signed, to a URL.

hook = add_webhook("https://example.com/hooks", events=["created", "killed"], client=c)   # hook.secret: once
deliveries(hook.id, client=c)                   # status, attempts, the receiver's last answer
"""

from __future__ import annotations

from urllib.parse import quote

from ..models import build
from ..webhook_models import AttemptInfo, CreatedWebhook, CreateWebhookRequest, DeliveryInfo, WebhookInfo
from ._base import Call, _model, _models
from ._client import Client


def add_webhook(
    url: str, *, client: Client, events: list[str] | None = None, team: str | None = None,
    allow_private: bool = False, description: str = "",
) -> CreatedWebhook:  # fmt: skip
    fields = {"url": url, "team": team, "allow_private": allow_private, "description": description}
    body = build(CreateWebhookRequest, **fields, **({"events": events} if events else {})).model_dump(mode="json")
    return client.call(Call("POST", "/v1/webhooks", _model(CreatedWebhook), json=body))  # type: ignore[no-any-return]


def list_webhooks(*, client: Client) -> list[WebhookInfo]:
    return client.call(Call("GET", "/v1/webhooks", _models(WebhookInfo)))  # type: ignore[no-any-return]


def remove_webhook(hook_id: str, *, client: Client) -> None:
    client.call(Call("DELETE", f"/v1/webhooks/{quote(hook_id)}", lambda r: None))


def deliveries(hook_id: str, *, client: Client, limit: int = 100) -> list[DeliveryInfo]:
    call = Call("GET", f"/v1/webhooks/{quote(hook_id)}/deliveries", _models(DeliveryInfo), params={"limit": limit})
    return client.call(call)  # type: ignore[no-any-return]


def attempts(delivery_id: str, *, client: Client) -> list[AttemptInfo]:
    call = Call("GET", f"/v1/webhook-deliveries/{quote(delivery_id)}/attempts", _models(AttemptInfo))
    return client.call(call)  # type: ignore[no-any-return]


def redeliver(delivery_id: str, *, client: Client) -> None:
    client.call(Call("POST", f"/v1/webhook-deliveries/{quote(delivery_id)}/redeliver", lambda r: None))
