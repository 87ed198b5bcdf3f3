"""`stasis fleet`: many hosts as one, on Ray. `local` starts a real Ray cluster of N nodes on this machine; `nodes`
and `kill-node` ask the fleet's front door (``STASIS_FLEET``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..errors import InvalidRequest
from ..paths import Paths, default_home
from ._common import Json, app, client, err, out, shown

fleet_app = typer.Typer(
    help="Many hosts as one, on Ray: a daemon per node behind one front door.", no_args_is_help=True
)
app.add_typer(fleet_app, name="fleet")


@fleet_app.command()
def local(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Nodes of the cluster (each a raylet and a daemon).")] = 2,
    cpus: Annotated[int, typer.Option("--cpus", help="Ray CPUs each node offers.")] = 1,
    home: Annotated[Path | None, typer.Option("--home", help="Where the nodes keep their state.")] = None,
    listen: Annotated[str, typer.Option("--listen", help="The front door's loopback HOST:PORT (port 0: any).")] = (
        "127.0.0.1:0"
    ),
    store: Annotated[
        str | None, typer.Option("--store", help="The fleet's store (s3://… if hosts join; default: a directory)")
    ] = None,
) -> None:
    """Start a real Ray cluster on this machine, a daemon per node and the front door; print the exports;
    on Ctrl-C or SIGTERM remove its sandboxes and stop everything it started."""
    from ..fleet.local import LocalFleet, serve

    place = home or Path(os.environ.get("STASIS_HOME") or default_home()) / "fleet"

    def announce(exports: dict[str, str]) -> None:
        for name, value in exports.items():
            out.print(f"export {name}={value}", highlight=False, soft_wrap=True)
        err.print(f"[dim]a fleet of {nodes} nodes under {place}; Ctrl-C stops it all[/dim]")

    with err.status(f"starting a Ray cluster of {nodes} nodes and their daemons..."):
        fleet = LocalFleet(place.absolute(), Paths.from_env().images, nodes=nodes, cpus_per_node=cpus, store=store)
    serve(fleet, listen, announce)


def _door() -> Any:
    daemon = client()
    if not os.environ.get("STASIS_FLEET"):
        raise InvalidRequest("no fleet: set STASIS_FLEET (and STASIS_TOKEN) as `stasis fleet local` printed them")
    return daemon


@fleet_app.command("nodes")
def list_nodes(as_json: Json = False) -> None:
    """The fleet's nodes: their state, sandboxes, free CPU and memory."""
    nodes = _door().request("GET", "/v1/fleet/nodes").json()
    if as_json:
        print(json.dumps(nodes, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("NODE", "STATE", "SANDBOXES", "RUNNING", "FREE CPU", "FREE MEMORY", "DAEMON"):
        table.add_column(column)
    for node in nodes:
        cpu = f"{node.get('free_cpus', 0):g}/{node.get('cpus', 0):g}"
        memory = f"{node.get('free_memory_mb', 0)}/{node.get('memory_mb', 0)} MiB"
        counts = str(node.get("sandboxes", "?")), str(node.get("running", "?"))
        table.add_row(shown(node["name"]), node["state"], *counts, cpu, memory, shown(node.get("url") or "-"))
    out.print(table)


@fleet_app.command("kill-node")
def kill_node(node: Annotated[str, typer.Argument(help="A node of a local fleet.")]) -> None:
    """Remove a node of a local fleet as a host's loss would: its raylet, agent and daemon killed."""
    _door().request("DELETE", f"/v1/fleet/nodes/{node}")
    out.print(f"node [bold]{shown(node)}[/bold] removed")


@fleet_app.command("move")
@app.command(hidden=True)  # `stasis move NAME NODE` too; the front page shows it under `fleet`
def move(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    node: Annotated[str | None, typer.Argument(help="The node it goes to (default: the roomiest other one).")] = None,
) -> None:
    """Through a fleet: suspend it, hand it over through the store, resume it on NODE, processes kept."""
    from ..sdk import Sandbox

    _door()
    with err.status(f"moving {name}..."):
        info = Sandbox.connect(name, client=client()).move(node)
    out.print(f"[bold]{shown(info.name or info.id)}[/bold] runs on node [bold]{shown(info.node)}[/bold] now")


@fleet_app.command()
def join(
    address: Annotated[str, typer.Option("--address", help="The fleet's Ray cluster, HOST:PORT (its RAY_ADDRESS).")],
    name: Annotated[str, typer.Option("--name", help="This node's name in the fleet.")],
    store: Annotated[
        str | None, typer.Option("--store", help="The fleet's store (default: $STASIS_REMOTE): s3://… or file://…")
    ] = None,
    home: Annotated[Path | None, typer.Option("--home", help="Where this node keeps its state.")] = None,
    cpus: Annotated[int | None, typer.Option("--cpus", help="Ray CPUs this node offers (default: the host's).")] = None,
) -> None:
    """Make this host a node of a fleet, until Ctrl-C, SIGTERM or `stasis fleet leave NAME`; then hand every
    sandbox to the fleet's store (nothing lost) and stop all it started. Wants STASIS_TOKEN (the fleet's) and
    RAY_AUTH_TOKEN_PATH, as the fleet printed them."""
    import signal
    import threading

    from ..fleet.join import Join

    token = os.environ.get("STASIS_TOKEN")
    if not token:
        raise InvalidRequest("a node takes the fleet's token: export STASIS_TOKEN as the fleet printed it")
    place = home or Path(os.environ.get("STASIS_HOME") or default_home()) / "node"
    images = Path(os.environ["STASIS_IMAGE_DIR"]) if os.environ.get("STASIS_IMAGE_DIR") else None
    node = Join(address, name, place.absolute(), token, store or os.environ.get("STASIS_REMOTE", ""), cpus, images)
    stop = threading.Event()
    try:
        with err.status(f"joining the fleet at {address} as node {name}..."):
            described = node.start()
        for sig in (signal.SIGINT, signal.SIGTERM):  # now: ray.init() put its own SIGTERM handler (exit) in place
            signal.signal(sig, lambda *_: stop.set())
        out.print(f"node [bold]{shown(name)}[/bold] joined: its daemon on {shown(described['url'])}", highlight=False)
        node.wait(stop)
        if not node.left.is_set():
            with err.status(f"node {name} leaves: its sandboxes go to the fleet's store..."):
                result = node.leave()
            if not result["left"]:
                err.print(f"[red]{len(result['kept'])} could not be handed to the store; they stay in {place}: "
                          "join again with the same --name and --home to bring them back[/red]")  # fmt: skip
                raise typer.Exit(1)
        out.print(f"node [bold]{shown(name)}[/bold] left the fleet")
    finally:
        node.stop()


@fleet_app.command()
def leave(node: Annotated[str, typer.Argument(help="The node that leaves.")]) -> None:
    """A node leaves the fleet on purpose: its sandboxes suspended and handed to the store (any request brings
    one back on a live node), its daemon stopped; its `stasis fleet join` then stops."""
    with err.status(f"node {node} hands its sandboxes to the fleet's store..."):
        result = _door().request("POST", f"/v1/fleet/nodes/{node}/leave").json()
    handed = ", ".join(shown(h) for h in result["handed"]) or "none"
    out.print(f"node [bold]{shown(node)}[/bold] left; sandboxes handed to the store: {handed}")
