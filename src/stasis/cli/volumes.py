"""`stasis volume create|ls|set|rm|ls-files|snapshot|snapshots|rm-snapshot|push|pull`: directory trees that outlive
sandboxes."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from ..sdk.volume import Volume
from ._common import Json, app, client, err, out

volume_app = typer.Typer(help="Volumes: files that outlive sandboxes, mounted with `stasis create -v NAME:/PATH`.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(volume_app, name="volume")
VolumeName = Annotated[str, typer.Argument(help="The volume's name.")]
MaxSize = Annotated[
    int | None,
    typer.Option("--max-size-mb", min=1, help="A size limit in MiB: past it, writes fail (needs the btrfs store)."),
]


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


@volume_app.command("create")
def volume_create(
    name: VolumeName,
    from_snapshot: Annotated[
        str | None, typer.Option("--from-snapshot", help="A writable fork of this snapshot.")
    ] = None,
    max_size_mb: MaxSize = None,
) -> None:
    """Create an empty volume, or a fork of a snapshot's files."""
    with err.status(f"creating volume {name}..."):
        Volume.create(name, from_snapshot=from_snapshot, max_size_mb=max_size_mb, client=client())
    out.print(f"created volume [bold]{name}[/bold]" + (f" from {from_snapshot}" if from_snapshot else ""))


@volume_app.command("ls")
def volume_ls(as_json: Json = False) -> None:
    """List volumes: their size and the sandboxes that mount them."""
    volumes = Volume.list(client=client())
    if as_json:
        sys.stdout.write(json.dumps([v.model_dump(mode="json") for v in volumes], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "SIZE", "LIMIT", "MOUNTED BY", "FROM", "CREATED"):
        table.add_column(column)
    for v in volumes:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.created_at))
        limit = f"{v.max_size_mb} MiB" if v.max_size_mb else "-"
        table.add_row(v.name, _size(v.size_bytes), limit, ", ".join(v.mounted_by) or "-", v.from_snapshot or "-",
                      created)  # fmt: skip
    out.print(table if volumes else "no volumes; make one with `stasis volume create NAME`")


@volume_app.command("set")
def volume_set(
    name: VolumeName,
    max_size_mb: MaxSize = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Remove the size limit.")] = False,
) -> None:
    """Change a volume's size limit (below what it holds: it keeps its files and takes no more writes)."""
    if (max_size_mb is None) == (not no_limit):
        raise typer.BadParameter("give --max-size-mb N or --no-limit")
    info = Volume(name, client()).set_max_size(max_size_mb)
    limit = f"{info.max_size_mb} MiB" if info.max_size_mb else "no limit"
    out.print(f"volume [bold]{name}[/bold]: {limit} ({_size(info.size_bytes)} used)")


@volume_app.command("rm")
def volume_rm(name: VolumeName) -> None:
    """Remove a volume and its files (refused while a sandbox mounts it); its snapshots stay."""
    Volume(name, client()).delete()
    out.print(f"removed volume [bold]{name}[/bold]")


@volume_app.command("ls-files")
def volume_ls_files(name: VolumeName, path: Annotated[str, typer.Argument()] = "/", as_json: Json = False) -> None:
    """List one directory of a volume (links shown as links, never followed)."""
    listing = Volume(name, client()).listing(path)
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    for entry in listing["entries"]:
        link = f" -> {entry['target']}" if "target" in entry else ""
        out.print(f"{entry['type']:9} {entry['size']:>12} {entry['name']}{link}", highlight=False)


@volume_app.command("snapshot")
def volume_snapshot(
    name: VolumeName, snapshot_name: Annotated[str | None, typer.Option("--name", help="Name the snapshot.")] = None
) -> None:
    """A read-only copy of the volume's files now (its sandboxes may keep writing: suspend them for one instant)."""
    with err.status(f"snapshotting volume {name}..."):
        snap = Volume(name, client()).snapshot(snapshot_name)
    out.print(f"snapshot [bold]{snap.id}[/bold] of {name} ({_size(snap.size_bytes)}); fork it with "
              f"`stasis volume create NEW --from-snapshot {snap.name or snap.id}`")  # fmt: skip


@volume_app.command("snapshots")
def volume_snapshots(volume: Annotated[str | None, typer.Argument()] = None, as_json: Json = False) -> None:
    """List volume snapshots (of one volume, if named)."""
    snaps = Volume.snapshots(volume, client=client())
    if as_json:
        sys.stdout.write(json.dumps([s.model_dump(mode="json") for s in snaps], indent=2) + "\n")
        return
    for s in snaps:
        out.print(f"{s.id}  {s.volume}  {s.name or '-'}  {_size(s.size_bytes)}", highlight=False)


@volume_app.command("rm-snapshot")
def volume_rm_snapshot(ref: Annotated[str, typer.Argument(help="The snapshot's id or name.")]) -> None:
    """Remove a volume snapshot (the volumes forked from it keep their files)."""
    Volume.delete_snapshot(ref, client=client())
    out.print(f"removed volume snapshot [bold]{ref}[/bold]")


@volume_app.command("push")
def volume_push(name: VolumeName) -> None:
    """Send a copy of a volume's files to the remote store (another node pulls it; the newest push wins)."""
    with err.status(f"pushing volume {name}..."):
        result = Volume(name, client()).push()
    out.print(f"pushed volume [bold]{name}[/bold] ({result.bytes / 1e6:.1f} MB, {result.moved_bytes / 1e6:.1f} MB "
              f"on the wire, {result.seconds:.1f}s)")  # fmt: skip


@volume_app.command("pull")
def volume_pull(name: VolumeName) -> None:
    """Make volume NAME here from the remote store's copy (refused if this node has one of that name)."""
    with err.status(f"pulling volume {name}..."):
        Volume.pull(name, client=client())
    out.print(f"pulled volume [bold]{name}[/bold]")
