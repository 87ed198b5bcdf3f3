"""`stasis webhook add|ls|rm|deliveries|redeliver`: lifecycle events of sandboxes, posted and signed."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from ..sdk import webhook as hooks
from ..webhook_models import EVENT_TYPES
from ._common import Json, app, client, out

webhook_app = typer.Typer(help="Webhooks: sandboxes' lifecycle events posted to a URL, signed, at least once.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(webhook_app, name="webhook", hidden=True)  # on the front page through `team`'s line (one screen)


@webhook_app.command("add")
def webhook_add(
    url: Annotated[str, typer.Argument(help="Where to POST: https://host/path (public unless --allow-private).")],
    events: Annotated[str, typer.Option("--events", help=f"Comma-separated: {','.join(EVENT_TYPES)}.")] = "",
    team: Annotated[str | None, typer.Option("--team", help="Only this team's sandboxes.")] = None,
    allow_private: Annotated[
        bool, typer.Option("--allow-private", help="May reach private ranges, loopback and this host.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Add a webhook; prints its signing secret once."""
    wanted = [e.strip() for e in events.split(",") if e.strip()] or None
    made = hooks.add_webhook(url, client=client(), events=wanted, team=team, allow_private=allow_private)
    if as_json:
        sys.stdout.write(json.dumps({"id": made.id, "secret": made.secret, "events": made.events}) + "\n")
        return
    out.print(f"webhook [bold]{made.id}[/bold] for {', '.join(made.events)}; its signing secret (shown once):")
    print(made.secret)


@webhook_app.command("ls")
def webhook_ls(as_json: Json = False) -> None:
    """List webhooks."""
    found = hooks.list_webhooks(client=client())
    if as_json:
        sys.stdout.write(json.dumps([h.model_dump(mode="json") for h in found], indent=2) + "\n")
        return
    for h in found:
        scope = f"team {h.team}" if h.team else "every sandbox"
        out.print(f"{h.id}  {h.url}  {','.join(h.events)}  ({scope})", highlight=False)
    if not found:
        out.print("no webhooks; add one with `stasis webhook add URL`")


@webhook_app.command("rm")
def webhook_rm(hook_id: Annotated[str, typer.Argument(help="The webhook's id.")]) -> None:
    """Remove a webhook (its pending deliveries go with it)."""
    hooks.remove_webhook(hook_id, client=client())
    out.print(f"removed webhook [bold]{hook_id}[/bold]")


@webhook_app.command("deliveries")
def webhook_deliveries(hook_id: Annotated[str, typer.Argument()], as_json: Json = False) -> None:
    """A webhook's deliveries, newest first: status, attempts, the receiver's last answer and its duration."""
    found = hooks.deliveries(hook_id, client=client())
    if as_json:
        sys.stdout.write(json.dumps([d.model_dump(mode="json") for d in found], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("DELIVERY", "EVENT", "SANDBOX", "STATUS", "ATTEMPTS", "LAST", "MS", "WHEN"):
        table.add_column(column)
    for d in found:
        when = time.strftime("%H:%M:%S", time.localtime(d.delivered_at or d.next_at or 0))
        last = str(d.last_status or d.last_error or "-")[:40]
        ms = f"{d.last_duration_ms:.0f}" if d.last_duration_ms is not None else "-"
        table.add_row(d.id, d.event_type, d.sandbox_id, d.status, str(d.attempts), last, ms, when)
    out.print(table)


@webhook_app.command("redeliver")
def webhook_redeliver(delivery_id: Annotated[str, typer.Argument()]) -> None:
    """Deliver one again now (a failed one, or one the receiver lost)."""
    hooks.redeliver(delivery_id, client=client())
    out.print(f"redelivering [bold]{delivery_id}[/bold]")
