"""`stasis push` and `stasis pull`: sandboxes and checkpoints through the daemon's remote store."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from ..models import TransferResult
from ..sdk._host import remote_call, remote_listing_call
from ._common import Json, ago, app, client, err, out, shown

Kind = Annotated[
    str | None, typer.Option("--kind", help="sandbox | checkpoint, when a name could be either; volume for a volume.")
]


def _report(result: TransferResult, verb: str, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    moved = f"{result.moved_chunks} of {result.chunks} pieces, {result.moved_bytes / 1e6:.1f} MB on the wire"
    out.print(f"{verb} {result.kind} [bold]{result.name or result.id}[/bold] ({result.bytes / 1e6:.1f} MB): "
              f"{moved}, {result.seconds:.1f}s")  # fmt: skip
    out.print(f"[dim]{result.url}[/dim]")


@app.command()
def push(
    ref: Annotated[str, typer.Argument(help="A sandbox or a checkpoint: name or id.")],
    kind: Kind = None,
    as_json: Json = False,
) -> None:
    """Send a sandbox (suspended first; it leaves this node) or a checkpoint (copied) to the remote store."""
    with err.status(f"pushing {ref}..."):
        result = client().call(remote_call("push", ref, kind))
    _report(result, "pushed", as_json)
    if result.kind == "sandbox" and not as_json:
        out.print("any node of the store resumes it: [bold]stasis resume[/bold] " + (result.name or result.id))


@app.command()
def pull(
    ref: Annotated[str, typer.Argument(help="A sandbox or a checkpoint in the remote store: name or id.")],
    kind: Kind = None,
    as_json: Json = False,
) -> None:
    """Take a sandbox over from the remote store (suspended, not resumed) or copy a checkpoint here."""
    with err.status(f"pulling {ref}..."):
        result = client().call(remote_call("pull", ref, kind))
    _report(result, "pulled", as_json)


@app.command(name="remote")
def remote_listing(as_json: Json = False) -> None:
    """What the remote store holds: sandboxes (and the node that owns each) and checkpoints."""
    entries = client().call(remote_listing_call())
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("KIND", "NAME", "ID", "BACKEND", "IMAGE", "OWNER", "PUSHED"):
        table.add_column(column)
    for e in entries:
        owner = (shown(e.owner) if e.owner else "[green]the store[/green]") if e.kind == "sandbox" else ""
        table.add_row(e.kind, shown(e.name or ""), shown(e.id), shown(e.backend), shown(e.image), owner,
                      f"{ago(e.pushed_at)} by {shown(e.pushed_by)}")  # fmt: skip
    out.print(table)
