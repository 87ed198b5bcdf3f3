"""Webhooks: each lifecycle event (the core's outbox, :mod:`..core.events`) posted to every webhook that asks for
it, at least once, signed.

A delivery is one row per webhook and event, made when the event is seen (the webhook's cursor moves past it in
the same transaction); each attempt is logged with its status and duration. A failure is retried with back-off
(1 s, 2 s, 4 s ... at most an hour apart) up to MAX_ATTEMPTS, then the delivery is ``failed`` until redelivered
on request. Each webhook is served by its own task, its events in order: a receiver that is down delays only
itself. A daemon killed mid-way delivers what it had not after its restart (a delivery posted but not recorded
is posted again: at least once, and the event's id lets a receiver drop a repeat).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from ...errors import NotFound, QuotaExceeded, echo
from ...webhook_models import AttemptInfo, CreatedWebhook, CreateWebhookRequest, DeliveryInfo, WebhookInfo
from ..core.service import SandboxService
from ..core.tables import WebhookTable
from . import webhook_delivery as delivery

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 15
MAX_PER_TEAM = 20  # webhooks of one team (or of the owner)
MAX_WEBHOOKS = 1000
POLL = 0.5  # seconds between looks at the outbox


class WebhooksRoom:
    def __init__(self, core: SandboxService, table: WebhookTable) -> None:
        self.core = core
        self.table = table  # this room is its one writer
        self._task: asyncio.Task[None] | None = None
        self._draining: dict[str, asyncio.Task[None]] = {}
        self.describe: Callable[[str], dict[str, Any]] = lambda sandbox_id: {}  # E2B's view of a sandbox (wiring)

    # -- managing

    async def add(self, request: CreateWebhookRequest) -> CreatedWebhook:
        hooks = self.list()
        if len([h for h in hooks if h.team == request.team]) >= MAX_PER_TEAM or len(hooks) >= MAX_WEBHOOKS:
            whose = f"team {request.team}" if request.team else "the owner"
            raise QuotaExceeded(
                f"{whose} has the most webhooks there may be ({MAX_PER_TEAM} each, {MAX_WEBHOOKS} in all); remove one"
            )
        _, host, port = delivery.check_url(request.url)
        if not request.allow_private:
            await delivery.public_address(host, port)  # said now; checked again at each delivery
        fields = request.model_dump(include={"url", "events", "team", "allow_private", "description", "flavor",
                                             "name", "enabled"})  # fmt: skip
        hook = WebhookInfo(id="wh_" + secrets.token_hex(8), created_at=time.time(), **fields)
        secret = request.secret or "whsec_" + secrets.token_hex(24)
        self.table.insert_webhook(hook, secret, self.core.last_event())  # from the next event on
        log.info("webhook %s added: %s for %s", hook.id, hook.url, ",".join(hook.events))
        return CreatedWebhook(**hook.model_dump(), secret=secret)

    def list(self) -> list[WebhookInfo]:
        return [hook for hook, _, _ in self.table.webhooks()]

    def get(self, hook_id: str) -> WebhookInfo:
        for hook in self.list():
            if hook.id == hook_id:
                return hook
        raise NotFound(f"no webhook {echo(hook_id)}; `stasis webhook ls` lists them")

    async def update(self, hook_id: str, changes: dict[str, object]) -> WebhookInfo:
        """Its URL, events, name, enabled or secret replaced by those given (a new URL is checked as at add)."""
        found = [(h, s) for h, s, _ in self.table.webhooks() if h.id == hook_id]
        if not found:
            raise NotFound(f"no webhook {echo(hook_id)}; `stasis webhook ls` lists them")
        hook, secret = found[0]
        if "url" in changes:  # checked as at add, against what may be reached now
            _, host, port = delivery.check_url(str(changes["url"]))
            if not changes.get("allow_private", hook.allow_private):
                await delivery.public_address(host, port)
        secret = str(changes.pop("secret", None) or secret)
        hook = WebhookInfo.model_validate({**hook.model_dump(), **changes})
        self.table.update_webhook(hook, secret)
        return hook

    def remove(self, hook_id: str) -> None:
        self.get(hook_id)
        self.table.delete_webhook(hook_id)

    def deliveries(self, hook_id: str, limit: int = 100) -> list[DeliveryInfo]:
        self.get(hook_id)
        return self.table.deliveries(hook_id, limit)

    def attempts(self, delivery_id: str) -> list[AttemptInfo]:
        return self.table.attempts(delivery_id)

    def redeliver(self, delivery_id: str) -> None:
        if not self.table.retry_now(delivery_id, time.time()):
            raise NotFound(f"no delivery {echo(delivery_id)}; `stasis webhook deliveries WEBHOOK` lists them")

    # -- delivering

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="webhooks")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._draining.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self) -> None:
        while True:
            try:
                self._enqueue()
                for hook, secret, _ in self.table.webhooks():
                    busy = self._draining.get(hook.id)
                    head = self.table.pending(hook.id, 1) if busy is None or busy.done() else []
                    if head and head[0]["next_at"] <= time.time():
                        self._draining[hook.id] = asyncio.create_task(self._drain(hook, secret))
            except Exception:  # logged: the loop outlives one bad turn
                log.exception("webhook delivery loop")
            await asyncio.sleep(POLL)

    def _enqueue(self) -> None:
        """A delivery for each new event each webhook wants; its cursor past every event seen."""
        for hook, _, cursor in self.table.webhooks():
            events = self.core.events_after(cursor)
            if not events:
                continue
            wanted = [e["seq"] for e in events if hook.enabled and e["type"] in hook.events
                      and hook.team in (None, e["team"])]  # fmt: skip
            self.table.enqueue(hook.id, wanted, events[-1]["seq"], time.time())

    async def _drain(self, hook: WebhookInfo, secret: str) -> None:
        """This webhook's due deliveries, in order; the first that fails waits for its retry, and the rest behind
        it (a receiver sees its events in order)."""
        for event in self.table.pending(hook.id):
            if event["next_at"] > time.time() or not await self._attempt(hook, secret, event):
                return  # the oldest waits for its retry, and every later one behind it

    async def _attempt(self, hook: WebhookInfo, secret: str, event: dict[str, object]) -> bool:
        headers = {"content-type": "application/json", "user-agent": "stasis-webhooks"}
        if hook.flavor == "e2b":  # E2B's payload and headers, for receivers written against E2B
            try:
                context = self.describe(str(event["sandbox_id"]))
            except Exception:  # logged: the event goes out with less said, never jams the ones behind it
                log.exception("describing %s for webhook %s", event["sandbox_id"], hook.id)
                context = {}
            body = delivery.e2b_body(event, context)
            headers |= {"e2b-webhook-id": hook.id, "e2b-delivery-id": str(event["id"]), "e2b-signature-version": "v1",
                        "e2b-signature": delivery.e2b_signature(secret, body)}  # fmt: skip
        else:
            body = delivery.body_of(event)
            headers |= {"stasis-signature": delivery.signature(secret, body, int(time.time())),
                        "stasis-event-id": str(event["event_id"]), "stasis-event-type": str(event["event_type"]),
                        "stasis-delivery-id": str(event["id"])}  # fmt: skip
        started = time.monotonic()
        code, error = await delivery.post(hook.url, hook.allow_private, body, headers)
        elapsed_ms = (time.monotonic() - started) * 1000
        attempts = int(event["attempts"]) + 1  # type: ignore[call-overload]
        ok = error is None
        status = "delivered" if ok else "failed" if attempts >= MAX_ATTEMPTS else "pending"
        retry = None if ok or status == "failed" else time.time() + min(2 ** (attempts - 1), 3600)
        self.table.attempted(str(event["id"]), {"at": time.time(), "code": code, "ms": elapsed_ms, "error": error,
                                                "status": status, "next_at": retry,
                                                "delivered_at": time.time() if ok else None})  # fmt: skip
        if not ok:
            log.warning("webhook %s: delivery %s failed (attempt %d): %s", hook.id, event["id"], attempts, error)
        return ok
