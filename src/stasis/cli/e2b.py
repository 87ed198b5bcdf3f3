"""`stasis e2b serve`: the E2B face on a TCP listener, for the official E2B SDKs."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import httpx
import typer
from rich.progress import Progress, SpinnerColumn, TextColumn

from ..backends import DEFAULT_BACKEND
from ..e2b_models import E2bServeRequest
from ..e2b_wire import domain_host
from ..errors import StasisError
from ..sdk import e2b
from ._common import app, client, err, out

e2b_app = typer.Typer(help="Speak E2B: the official E2B SDKs (Python, TypeScript) against this daemon.")
app.add_typer(e2b_app, name="e2b")


@e2b_app.command("serve")
def serve(
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to listen on (port 0: any free one).")] = (
        "127.0.0.1:3000"
    ),
    backend: Annotated[str, typer.Option("--backend", help="What E2B's sandboxes run on.")] = DEFAULT_BACKEND,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Each sandbox's memory.")] = 1024,
    domain: Annotated[
        str | None, typer.Option("--domain", help="Also route Host PORT-ID.DOMAIN (a wildcard DNS name of yours).")
    ] = None,
    fleet: Annotated[
        str | None, typer.Option("--fleet", help="A fleet's front door (default: $STASIS_FLEET, if set).")
    ] = None,
    build_network: Annotated[
        bool, typer.Option("--build-network", help="Let template builds' steps reach the network (apt, pip, git).")
    ] = False,
) -> None:
    """Serve E2B's API until interrupted; prints the three variables to export for the SDKs."""
    request = E2bServeRequest(
        listen=listen, backend=backend, memory_mb=memory_mb, domain=domain, build_network=build_network
    )
    if fleet:
        os.environ["STASIS_FLEET"] = fleet
    daemon = client()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), console=err, transient=True) as progress:
        task = progress.add_task("the base template's image (e2b-base)")

        def step(number: int, total: int, description: str, cached: bool) -> None:
            state = "cached" if cached else "building"
            progress.update(task, description=f"e2b-base: step {number}/{total} {state}: {description[:60]}")

        if os.environ.get("STASIS_FLEET"):  # each node's images, made by the door as it opens that node's face
            progress.update(task, description="E2B's face on every node of the fleet (its images built once per node)")
        else:
            e2b.base_image(daemon, on_step=step)
            progress.update(task, description="code-interpreter-v1: its image and warm template (made once)")
            e2b.code_template(backend, daemon)
        lines = e2b.serve(request, daemon)
        first = next(lines)
    for name, value in first["exports"].items():
        out.print(f"export {name}={value}", highlight=False, soft_wrap=True)
    if named := first.get("domain"):
        err.print(f"[dim]get_host(port) names PORT-SANDBOXID.{named}[/dim]{_resolves(named)}", highlight=False)
    err.print(f"[dim]E2B's API on {first['listening']} (backend {backend}); Ctrl-C stops it[/dim]")
    try:
        for _ in lines:
            pass
        raise StasisError("the daemon ended the listener")
    except KeyboardInterrupt:
        pass
    except (StasisError, httpx.HTTPError) as exc:
        err.print(f"[red]the daemon went away ({exc}); its listener went with it: run `stasis e2b serve` again[/red]")
        raise typer.Exit(1) from None
    finally:
        lines.close()


def _resolves(domain: str) -> str:
    """Nothing if names under ``domain`` resolve here, else what to do about it."""
    try:
        socket.getaddrinfo(f"8000-probe.{domain_host(domain)}", 80)
    except OSError:
        return (
            f"\n[yellow]names under {domain_host(domain)} do not resolve on this machine: for *.localhost install "
            "libnss-myhostname (Debian, Ubuntu) or use systemd-resolved; or give --domain a wildcard name[/yellow]"
        )
    return ""
