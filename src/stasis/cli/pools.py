"""`stasis pool create|ls|rm`: warm pools, sandboxes started ahead that a matching create claims."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from ..sdk import Pool
from ._common import Json, app, client, err, out, shown

pool_app = typer.Typer(help="Warm pools: sandboxes started ahead, handed out by a matching `stasis create`.",
                       no_args_is_help=True)  # fmt: skip
app.add_typer(pool_app, name="pool")

PoolName = Annotated[str, typer.Argument(help="The pool's name.")]


@pool_app.command("create")
def pool_create(
    name: PoolName,
    image: Annotated[str, typer.Option("--image", help="The image its members boot.")] = "default",
    size: Annotated[int, typer.Option("--size", help="Members kept started and waiting.")] = 2,
    backend: Annotated[str | None, typer.Option("--backend", help="gvisor or microvm.")] = None,
    cpus: Annotated[float | None, typer.Option("--cpus", help="CPU cores of each member.")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="Memory of each member.")] = None,
    disk_mb: Annotated[int | None, typer.Option("--disk-mb", help="Disk of each member.")] = None,
    template: Annotated[str | None, typer.Option("--template", help="Members restored from this template.")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until every member is ready.")] = True,
) -> None:
    """Start SIZE sandboxes of this spec ahead; `stasis create` with the same spec claims one."""
    info = Pool.create(name, image, size=size, backend=backend, cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb,
                       template=template, client=client())  # fmt: skip
    if wait:
        with err.status(f"starting {size} members of pool {name}..."):
            info = Pool.wait_ready(name, client=client())
    out.print(f"pool [bold]{info.name}[/bold]: {info.ready}/{info.spec.size} ready ({info.spec.image} on "
              f"{info.spec.backend})")  # fmt: skip


@pool_app.command("ls")
def pool_ls(as_json: Json = False) -> None:
    """List pools: how many members are ready, starting and claimed."""
    pools = Pool.list(client=client())
    if as_json:
        sys.stdout.write(json.dumps([p.model_dump(mode="json") for p in pools], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "IMAGE", "BACKEND", "SIZE", "READY", "STARTING", "CLAIMED", "MEMORY", "LAST ERROR"):
        table.add_column(column)
    for p in pools:
        s = p.spec
        source = f"template {s.template}" if s.template else s.image
        counts = (str(s.size), str(p.ready), str(p.starting), str(p.claimed))
        table.add_row(p.name, source, s.backend, *counts, f"{s.memory_mb} MiB", shown(p.last_error or "-"))
    out.print(table if pools else "no pools; make one with `stasis pool create NAME --image I --size N`")


@pool_app.command("rm")
def pool_rm(name: PoolName) -> None:
    """Remove a pool and every member still waiting in it (sandboxes claimed from it stay)."""
    with err.status(f"removing pool {name}..."):
        Pool.remove(name, client=client())
    out.print(f"removed pool {name}")
