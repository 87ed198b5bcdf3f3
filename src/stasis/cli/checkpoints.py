"""`stasis checkpoint NAME` and `stasis checkpoints [rm]`."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.table import Table

from ..sdk import Sandbox
from ._common import Json, Name, ago, app, client, err, in_, out

checkpoints_app = typer.Typer(help="List (the default) and remove checkpoints.", invoke_without_command=True)
app.add_typer(checkpoints_app, name="checkpoints", hidden=True)  # on the front page through `checkpoint`'s line


@app.command()
def checkpoint(
    name: Name,
    type_: Annotated[str, typer.Option("--type", help="memory (processes too) | filesystem (files only)")] = "memory",
    checkpoint_name: Annotated[str | None, typer.Option("--name", help="A unique name for the checkpoint.")] = None,
    ttl_secs: Annotated[int | None, typer.Option("--ttl-secs", help="Delete it after this long.")] = None,
    include_volumes: Annotated[
        bool, typer.Option("--include-volumes", help="Snapshot its volumes too: a restore mounts forks of them.")
    ] = False,
) -> None:
    """Checkpoint a sandbox; it keeps running. Prints the checkpoint id."""
    sbx = Sandbox.connect(name, client=client())
    with err.status(f"checkpointing {name} ({type_})..."):
        started = time.monotonic()
        info = sbx.checkpoint(type_, name=checkpoint_name, ttl_secs=ttl_secs, include_volumes=include_volumes)
    err.print(f"{type_} checkpoint of {name}: {info.size_bytes / 1e6:.1f} MB in {time.monotonic() - started:.2f}s")
    print(info.id)


@checkpoints_app.callback()
def checkpoints(ctx: typer.Context, as_json: Json = False) -> None:
    """List checkpoints."""
    if ctx.invoked_subcommand is None:
        list_checkpoints(as_json)


@checkpoints_app.command("ls")
def checkpoints_ls(as_json: Json = False) -> None:
    """List checkpoints (as `stasis checkpoints` alone does)."""
    list_checkpoints(as_json)


def list_checkpoints(as_json: bool) -> None:
    items = Sandbox.list_checkpoints(client=client())
    if as_json:
        print(json.dumps([c.model_dump(mode="json") for c in items], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "TYPE", "FROM", "SIZE", "CREATED", "EXPIRES"):
        table.add_column(column, no_wrap=True)
    for c in items:
        expires = in_(c.expires_at) if c.expires_at else "never"
        table.add_row(
            c.id, c.name or "-", c.type.value, c.sandbox_name or c.sandbox_id, f"{c.size_bytes / 1e6:.1f} MB",
            ago(c.created_at), expires,
        )  # fmt: skip
    out.print(table if items else "no checkpoints; make one with `stasis checkpoint NAME`")


@checkpoints_app.command("rm")
def checkpoints_rm(ids: Annotated[list[str], typer.Argument(help="Checkpoint ids or names.")]) -> None:
    """Delete checkpoints."""
    connection = client()
    for checkpoint_id in ids:
        Sandbox.delete_checkpoint(checkpoint_id, client=connection)
        out.print(f"deleted checkpoint {checkpoint_id}")
