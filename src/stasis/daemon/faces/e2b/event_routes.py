"""E2B's sandbox lifecycle events: the events API (``/events/sandboxes``) and its webhooks (``/events/webhooks``),
over stasis' own outbox and webhooks. A webhook made here gets E2B's payload (version v2) and its ``e2b-signature``
(the unpadded base64 of SHA-256 over the signature secret and the body). A team's key sees and makes its team's."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import Field

from ....errors import InvalidRequest, NotFound, echo
from ....webhook_models import CreateWebhookRequest, WebhookInfo
from ...rooms import webhook_delivery as delivery
from ..tenancy import PrincipalDep
from .plane import PlaneDep, _Body, iso

router = APIRouter()
E2B_EVENTS = {"sandbox.lifecycle.created": ["created", "forked"], "sandbox.lifecycle.killed": ["killed", "failed"],
              "sandbox.lifecycle.updated": ["updated"], "sandbox.lifecycle.paused": ["suspended"],
              "sandbox.lifecycle.resumed": ["resumed"], "sandbox.lifecycle.checkpointed": ["checkpointed"]}  # fmt: skip


class NewWebhook(_Body):
    name: str = Field("", max_length=200)
    url: str = Field(max_length=2048)
    enabled: bool = True
    events: list[str] = Field(default_factory=lambda: list(E2B_EVENTS), max_length=len(E2B_EVENTS))
    signature_secret: str | None = Field(None, alias="signatureSecret", min_length=8, max_length=200)


class WebhookUpdate(_Body):
    name: str | None = Field(None, max_length=200)
    url: str | None = Field(None, max_length=2048)
    enabled: bool | None = None
    events: list[str] | None = Field(None, max_length=len(E2B_EVENTS))
    signature_secret: str | None = Field(None, alias="signatureSecret", min_length=8, max_length=200)


def ours(events: list[str]) -> list[str]:
    unknown = sorted(set(events) - set(E2B_EVENTS))
    if unknown:
        raise InvalidRequest(f"unknown event type {', '.join(unknown)}: use {', '.join(E2B_EVENTS)}")
    return [kind for event in events for kind in E2B_EVENTS[event]]


def shown(hook: WebhookInfo) -> dict[str, Any]:
    theirs = [e for e, kinds in E2B_EVENTS.items() if set(kinds) & set(hook.events)]
    return {"id": hook.id, "teamID": hook.team or "", "name": hook.name, "createdAt": iso(hook.created_at),
            "enabled": hook.enabled, "url": hook.url, "events": theirs}  # fmt: skip


def _private(plane: Any, team: str | None) -> bool:
    """Private addresses: the face's own key's, if the owner allows it; never a team's."""
    return team is None and bool(plane.room.private_webhooks)


def _mine(plane: Any, hook_id: str, team: str | None) -> WebhookInfo:
    missing = NotFound(f"webhook {echo(hook_id)} was not found")
    try:
        hook = plane.room.webhooks.get(hook_id)
    except NotFound:
        raise missing from None
    if hook.flavor != "e2b" or (team is not None and hook.team != team):
        raise missing
    return hook  # type: ignore[no-any-return]


@router.post("/events/webhooks", status_code=201)
async def add(body: NewWebhook, plane: PlaneDep, principal: PrincipalDep) -> dict[str, Any]:
    try:
        request = CreateWebhookRequest(
            url=body.url, events=ours(body.events), team=principal.team, flavor="e2b", name=body.name,
            enabled=body.enabled, secret=body.signature_secret, allow_private=_private(plane, principal.team),
        )  # fmt: skip
    except ValueError as exc:
        raise InvalidRequest(f"invalid webhook: {str(exc)[:300]}") from None
    return shown(await plane.room.webhooks.add(request))


@router.get("/events/webhooks")
async def listed(plane: PlaneDep, principal: PrincipalDep) -> list[dict[str, Any]]:
    return [shown(h) for h in plane.room.webhooks.list()
            if h.flavor == "e2b" and (principal.team is None or h.team == principal.team)]  # fmt: skip


@router.get("/events/webhooks/{hook_id}")
async def get(hook_id: str, plane: PlaneDep, principal: PrincipalDep) -> dict[str, Any]:
    return shown(_mine(plane, hook_id, principal.team))


@router.patch("/events/webhooks/{hook_id}")
async def update(hook_id: str, body: WebhookUpdate, plane: PlaneDep, principal: PrincipalDep) -> dict[str, Any]:
    _mine(plane, hook_id, principal.team)
    changes: dict[str, object] = body.model_dump(exclude_none=True, include={"name", "url", "enabled"})
    changes["allow_private"] = _private(plane, principal.team)  # what may be reached now, not when it was made
    if body.events is not None:
        if not body.events:
            raise InvalidRequest("a webhook needs at least one event type")
        changes["events"] = ours(body.events)
    if body.signature_secret is not None:
        changes["secret"] = body.signature_secret
    return shown(await plane.room.webhooks.update(hook_id, changes))


@router.delete("/events/webhooks/{hook_id}")
async def remove(hook_id: str, plane: PlaneDep, principal: PrincipalDep) -> Response:
    _mine(plane, hook_id, principal.team)
    plane.room.webhooks.remove(hook_id)
    return Response(status_code=200)


def _page(
    plane: Any, request: Request, team: str | None, sandbox: str | None, offset: int, limit: int, ascending: bool
) -> list[dict[str, Any]]:
    types = sorted(set(request.query_params.getlist("types")))
    kinds = ours(types) if types else []
    rows = plane.room.core.events_of(sandbox, team, kinds, offset, limit, ascending)
    for row in rows:
        row.update(event_id=row["id"], event_type=row["type"], event_at=row["at"], id=row["id"])
    return [json.loads(delivery.e2b_body(row, plane.room.describe(row["sandbox_id"]))) for row in rows]


Offset = Annotated[int, Query(ge=0, le=1_000_000)]
Limit = Annotated[int, Query(ge=1, le=100)]


@router.get("/events/sandboxes/{sandbox_id}")
async def sandbox_events(
    sandbox_id: str, request: Request, plane: PlaneDep, principal: PrincipalDep, offset: Offset = 0,
    limit: Limit = 10, order_asc: Annotated[bool, Query(alias="orderAsc")] = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """One sandbox's events, newest first (E2B's default)."""
    return _page(plane, request, principal.team, sandbox_id, offset, limit, order_asc)


@router.get("/events/sandboxes")
async def team_events(
    request: Request, plane: PlaneDep, principal: PrincipalDep, offset: Offset = 0, limit: Limit = 10,
    order_asc: Annotated[bool, Query(alias="orderAsc")] = False,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every sandbox's events (a team's key: its team's)."""
    return _page(plane, request, principal.team, None, offset, limit, order_asc)
