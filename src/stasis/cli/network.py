"""`stasis network|port|port-forward`: where a sandbox may connect, and reaching its servers."""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
from datetime import datetime
from typing import Annotated, Any

import typer
from websockets.exceptions import ConnectionClosed

from ..errors import InvalidRequest
from ..models import build
from ..netpolicy import NetworkPolicy
from ..paths import Paths
from ..sdk import Sandbox
from ..wsclient import open_websocket
from ._common import AllowOut, DenyOut, Json, Name, app, client, err, out, shown


@app.command()
def network(
    name: Name,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    internet: Annotated[bool, typer.Option("--internet", help="The public internet: clear both lists.")] = False,
    as_json: Json = False,
) -> None:
    """Show the sandbox's egress policy, or change it live (--allow-out/--deny-out replace the lists)."""
    sbx = Sandbox.connect(name, client=client())
    if allow_out is None and deny_out is None and not internet:
        policy = sbx.info().spec.network
    else:
        policy = build(NetworkPolicy, allow_out=allow_out or [], deny_out=deny_out or [])
        policy = sbx.update_network(policy).spec.network
    if as_json:
        sys.stdout.write((policy.model_dump_json(indent=2) if policy else "null") + "\n")
    else:
        out.print(shown(policy.describe()) if policy else "no network device (created without --network)")


@app.command()
def egress(
    name: Name,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Then each new connection as it ends.")] = False,
    as_json: Json = False,
) -> None:
    """Every connection the sandbox opened, allowed or denied: where to, the name it claimed, the rule, the bytes
    each way (the egress audit; a sandbox without network has none)."""
    sbx = Sandbox.connect(name, client=client())
    lines = sbx.follow_egress() if follow else iter(sbx.egress_log())
    if not follow and not as_json:
        lines = iter(list(lines))
    any_shown = False
    for line in lines:
        any_shown = True
        if as_json:
            print(json.dumps(line), flush=True)
            continue
        out.print(egress_line(line), highlight=False)
    if not any_shown and not follow and not as_json:
        out.print("no connections recorded (`stasis network NAME` shows its policy)")


def egress_line(line: dict[str, Any]) -> str:
    """One audit line as Rich markup. What the sandbox chose (the name it claimed, what it sent that failed)
    is shown as text: never markup, never a control sequence for the terminal."""
    when = datetime.fromtimestamp(line["time"]).strftime("%H:%M:%S")
    allowed = line["verdict"] == "allowed"
    moved = f"{line.get('bytes_out', 0)}/{line.get('bytes_in', 0)} B" if allowed else "-"
    colour = "green" if allowed else "red"
    where = shown(f"{line['destination']}:{line['port']}")
    extra = f"  secrets: {shown(', '.join(line['secrets']))}" if line.get("secrets") else ""
    extra += f"  ({shown(line['error'])})" if line.get("error") else ""
    return (f"{when}  [{colour}]{shown(line['verdict']):7}[/{colour}]  {where}  {shown(line.get('name') or '-')}  "
            f"{moved}  {shown(line.get('rule', ''))}{extra}")  # fmt: skip


@app.command()
def port(
    name: Name,
    number: Annotated[int, typer.Argument(help="The TCP port a server in the sandbox listens on.")],
    public: Annotated[bool, typer.Option("--public", help="No token: anyone who reaches the listener.")] = False,
    ttl_secs: Annotated[int, typer.Option("--ttl-secs", help="How long the URL's token is valid.")] = 86400,
    close: Annotated[bool, typer.Option("--close", help="Stop exposing it.")] = False,
) -> None:
    """Expose a port: prints a URL (HTTP and WebSocket) served by the daemon; a suspended sandbox resumes."""
    sbx = Sandbox.connect(name, client=client())
    if close:
        sbx.unexpose_port(number)
        err.print(f"port {number} of {name} is no longer exposed")
        return
    sys.stdout.write(sbx.expose_port(number, public=public, ttl_secs=ttl_secs) + "\n")


@app.command("port-forward")
def port_forward(
    name: Name,
    ports: Annotated[str, typer.Argument(help="LOCAL:REMOTE, e.g. 5432:5432 (or one number for both).")],
    address: Annotated[str, typer.Option("--address", help="Local address to listen on.")] = "127.0.0.1",
) -> None:
    """Forward a local TCP port to a port in the sandbox (raw TCP: databases, anything) until Ctrl-C."""
    local, _, remote = ports.partition(":")
    if not local.isdigit() or not (remote or local).isdigit():
        raise InvalidRequest(f"invalid port pair {ports!r}: use LOCAL:REMOTE, e.g. 5432:5432")
    sandbox = Sandbox.connect(name, client=client()).id
    listener = socket.create_server((address, int(local)))
    err.print(f"forwarding {address}:{listener.getsockname()[1]} to port {remote or local} of {name} (Ctrl-C stops)")
    paths = Paths.from_env()
    with listener:
        while True:
            conn, _ = listener.accept()
            args = (paths, f"/v1/sandboxes/{sandbox}/ports/{remote or local}/connect", conn)
            threading.Thread(target=_forward, args=args, daemon=True).start()


def _forward(paths: Paths, route: str, conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError, ConnectionClosed), open_websocket(paths, route) as ws:

        def upstream() -> None:
            with contextlib.suppress(OSError, ConnectionClosed):
                while data := conn.recv(256 * 1024):
                    ws.send(data)
            with contextlib.suppress(Exception):
                ws.close()

        threading.Thread(target=upstream, daemon=True).start()
        for message in ws:
            conn.sendall(message if isinstance(message, bytes) else message.encode())
