"""`stasis serve`, `stasis doctor` and `stasis image ls|build`: the daemon and the host."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Annotated

import typer
from rich.table import Table

from ..paths import Paths
from ._common import Json, ago, app, client, err, out

image_app = typer.Typer(help="Root filesystem images.", no_args_is_help=True)
app.add_typer(image_app, name="image")


@app.command()
def serve(
    tcp: Annotated[
        str | None,
        typer.Option(help="Also listen on HOST:PORT, or fd:N (a listening socket inherited); needs STASIS_TOKEN."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING.")] = "INFO",
    e2b: Annotated[
        str | None,
        typer.Option(help="Also serve E2B's API on HOST:PORT for the daemon's life (exports in HOME/e2b-exports)."),
    ] = None,
    e2b_domain: Annotated[str | None, typer.Option(help="With --e2b: route Host PORT-ID.DOMAIN too.")] = None,
    e2b_build_network: Annotated[
        bool, typer.Option(help="With --e2b: template builds' steps reach the network (apt, pip, git).")
    ] = False,
) -> None:
    """Run the daemon in the foreground (the CLI and SDK start it on demand)."""
    from ..daemon.server import serve as run_server
    from ..e2b_models import E2bServeRequest

    face = E2bServeRequest(listen=e2b, domain=e2b_domain, build_network=e2b_build_network) if e2b else None
    run_server(Paths.from_env(), tcp=tcp, token=os.environ.get("STASIS_TOKEN"), log_level=log_level.upper(), e2b=face)


@app.command()
def mcp() -> None:
    """Serve the MCP tools (create, run, files, suspend, checkpoint, fork, ...) over stdio.

    Point an MCP client at `stasis mcp`. Over streamable HTTP the daemon serves the same tools at
    /mcp (its unix socket, or TCP with the token)."""
    try:
        from ..integrations.mcp import serve_stdio
    except ImportError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    serve_stdio()


# ------------------------------------------------------------ the host


@app.command()
def doctor(as_json: Json = False) -> None:
    """Check which backends and accelerators work on this host, and why (no daemon needed)."""
    from ..doctor import check_host

    paths = Paths.from_env()
    paths.ensure()
    with err.status("probing backends (the first run builds the microVM kernel files)..."):
        report = asyncio.run(check_host(paths))
    if as_json:
        print(json.dumps(report, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("BACKEND", "WORKS", "DETAILS"):
        table.add_column(column)
    for name, result in report["backends"].items():
        works = "[green]yes[/green]" if result["works"] else "[red]no[/red]"
        details = "\n".join(f"{k.replace('_', ' ')}: {v}" for k, v in result.items() if k not in ("works", "backend"))
        table.add_row(name, works, details)
    out.print(table)
    images, steps = report["images"], report["build_step_caches"]
    listed = ", ".join(images) if images else "none built; run `stasis image build default`"
    cached = f" (and {steps} cached build steps: `stasis image prune` removes unused ones)" if steps else ""
    out.print(f"images: {listed}{cached}")
    if not any(r["works"] for r in report["backends"].values()):
        raise typer.Exit(1)


# ------------------------------------------------------------ images


@image_app.command("ls")
def image_ls(
    as_json: Json = False,
    everything: Annotated[bool, typer.Option("--all", help="Also the build steps' cached images.")] = False,
) -> None:
    """List images: built from a recipe, imported, or built from a Dockerfile."""
    from ..sdk.image import list_images

    images = [i for i in list_images(client()) if everything or i.name != "build-cache"]
    if as_json:
        print(json.dumps([i.model_dump() for i in images], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "KEY", "SIZE", "BUILT", "FROM"):
        table.add_column(column)
    for i in images:
        origin = ", ".join(i.packages) if i.source == "recipe" else i.source
        table.add_row(i.name, i.key, f"{i.size_bytes / 1e6:.0f} MB", ago(i.built_at), origin[:80])
    out.print(table if images else "no images; build one with `stasis image build default`")


@image_app.command("build")
def image_build(
    name: Annotated[str, typer.Argument(help="A recipe's name, or (with -f) the build context directory.")] = "default",
    file: Annotated[str | None, typer.Option("--file", "-f", help="Build this Dockerfile (FROM an image).")] = None,
    tag: Annotated[str | None, typer.Option("--tag", "-t", help="The built image's name (with -f).")] = None,
    build_arg: Annotated[list[str] | None, typer.Option("--build-arg", help="ARG value, NAME=VALUE.")] = None,
    network: Annotated[bool, typer.Option("--network", help="Build steps may reach the internet.")] = False,
    force: Annotated[bool, typer.Option(help="Rebuild a recipe even if cached.")] = False,
) -> None:
    """Build an image: a recipe (cached by its hash), or a Dockerfile whose steps run in build sandboxes, each
    cached: `stasis image build -f Dockerfile -t NAME [CONTEXT]`."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..sdk.image import build_recipe

    if file is not None:
        _build_dockerfile(file, tag, name if name != "default" else ".", build_arg or [], network)
        return
    asked = time.time()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err) as progress:
        task = progress.add_task(f"building image {name}", total=None)
        report = lambda line: progress.update(task, description=f"{name}: {line[:90]}")  # noqa: E731
        info = build_recipe(name, force=force, client=client(), on_progress=report)
    how = f"built in {info.build_seconds:.1f}s" if info.built_at >= asked else f"cached (built {ago(info.built_at)})"
    out.print(f"image [bold]{info.key}[/bold]: {info.size_bytes / 1e6:.0f} MB, {how}")


def _build_dockerfile(file: str, tag: str | None, context: str, build_args: list[str], network: bool) -> None:
    from ..errors import InvalidRequest
    from ..sdk.image import Image

    if not tag:
        raise InvalidRequest("name the image: stasis image build -f Dockerfile -t NAME [CONTEXT]")
    args = dict(arg.split("=", 1) for arg in build_args if "=" in arg)
    image = Image.from_dockerfile(file, context, args)

    def step(number: int, total: int, description: str, cached: bool) -> None:
        err.print(f"[bold]step {number}/{total}[/bold] {description}" + (" [dim](cached)[/dim]" if cached else ""),
                  highlight=False)  # fmt: skip

    def output(data: bytes) -> None:
        sys.stderr.write(data.decode(errors="replace"))
        sys.stderr.flush()

    info = image.build(tag, client=client(), network=True if network else None, on_step=step, on_output=output)
    out.print(f"image [bold]{info.name}[/bold] ({info.key}): {info.size_bytes / 1e6:.0f} MB")


@image_app.command("import")
def image_import(
    ref: Annotated[str, typer.Argument(help="docker-archive:PATH, oci-archive:PATH, oci:DIR[:TAG] or docker://REF.")],
    name: Annotated[str, typer.Option("--name", help="The image's name (`stasis create X --image NAME`).")],
) -> None:
    """Import an OCI or Docker image (no Docker daemon needed); its Env, WorkingDir and User apply to commands."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..sdk.image import import_image

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err) as progress:
        task = progress.add_task(f"importing {ref}", total=None)
        info = import_image(ref, name, client=client(),
                            on_progress=lambda line: progress.update(task, description=line[:100]))  # fmt: skip
    out.print(f"image [bold]{info.name}[/bold] ({info.key}): {info.size_bytes / 1e6:.0f} MB")


@image_app.command("inspect")
def image_inspect(name: Annotated[str, typer.Argument(help="Image name.")]) -> None:
    """Show an image: its build, where it came from, and (imported) how it asks to be run."""
    from ..sdk.image import get_image

    sys.stdout.write(get_image(name, client()).model_dump_json(indent=2) + "\n")


@image_app.command("rm")
def image_rm(name: Annotated[str, typer.Argument(help="Image name (every build of it) or one build's key.")]) -> None:
    """Remove an image; refused while a sandbox or checkpoint uses it (they are named)."""
    from ..sdk._images import remove_image_call

    removed = client().call(remove_image_call(name))
    out.print(f"removed {', '.join(removed)}")


@image_app.command("prune")
def image_prune(
    everything: Annotated[bool, typer.Option("--all", help="Also unused images that a name resolves to.")] = False,
) -> None:
    """Remove image builds nothing uses: old builds of a recipe, earlier imports under a name (--all: any)."""
    from ..sdk._images import prune_images_call

    removed = client().call(prune_images_call(everything))
    out.print(f"removed {', '.join(removed)}" if removed else "nothing to remove")


# ------------------------------------------------------------ templates

template_app = typer.Typer(help="Templates that start warm: a sandbox with its server already running.",
                           no_args_is_help=True)  # fmt: skip
app.add_typer(template_app, name="template")


@template_app.command("create")
def template_create(
    name: Annotated[str, typer.Argument(help="The template's name (`stasis create X --template NAME`).")],
    image: Annotated[str, typer.Option("--image", help="The image to boot.")] = "default",
    start: Annotated[str, typer.Option("--start", help="Started in the background (a shell command).")] = "",
    ready: Annotated[str | None, typer.Option("--ready", help="Ready when this exits 0 (polled).")] = None,
    ready_timeout: Annotated[float, typer.Option("--ready-timeout", help="Seconds to wait for --ready.")] = 120,
    backend: Annotated[str | None, typer.Option("--backend", help="gvisor or microvm.")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="Memory of every sandbox from it.")] = None,
    replace: Annotated[bool, typer.Option("--replace", help="Make it again if it exists.")] = False,
) -> None:
    """Boot an image, run --start, wait for --ready, and keep that instant (a MEMORY checkpoint)."""
    from ..errors import InvalidRequest
    from ..sdk import Template

    if not start:
        raise InvalidRequest("give the command that starts what the template keeps running: --start CMD")
    options = {k: v for k, v in (("backend", backend), ("memory_mb", memory_mb)) if v is not None}
    with err.status(f"making template {name} (waiting for it to be ready)...") as status:

        def checked(attempt: int, waited: float, said: str) -> None:
            status.update(f"template {name}: not ready after {waited:.0f}s of {ready_timeout:.0f} (check {attempt}: "
                          f"{said[:60]})")  # fmt: skip

        template = Template.create(name, image, start_cmd=start, ready_cmd=ready, ready_timeout=ready_timeout,
                                   replace=replace, client=client(), on_check=checked, **options)  # fmt: skip
    out.print(f"template [bold]{template.name}[/bold] ({template.checkpoint_id})")


@template_app.command("code-interpreter")
def template_code_interpreter(
    backend: Annotated[str | None, typer.Option("--backend", help="gvisor or microvm.")] = None,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory of every sandbox from it.")] = 1024,
    replace: Annotated[bool, typer.Option("--replace", help="Make it again if it exists.")] = False,
) -> None:
    """Make the template `code-interpreter`: its sandboxes start with a warm Python kernel, so the first
    `run_code` answers at once (E2B's code-interpreter-v1 uses it too)."""
    from ..sdk.template import interpreter_template

    options = {"memory_mb": memory_mb, **({"backend": backend} if backend else {})}
    with err.status("making template code-interpreter (starting its kernel)..."):
        template = interpreter_template(client=client(), replace=replace, **options)  # type: ignore[arg-type]
    out.print(f"template [bold]{template.name}[/bold] ({template.checkpoint_id}): "
              f"`stasis create NAME --template {template.name}`")  # fmt: skip


@template_app.command("ls")
def template_ls(as_json: Json = False) -> None:
    """List templates."""
    from dataclasses import asdict

    from ..sdk import Template

    templates = Template.list(client=client())
    if as_json:
        sys.stdout.write(json.dumps([asdict(t) for t in templates], indent=2) + "\n")
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "IMAGE", "START", "READY", "CHECKPOINT"):
        table.add_column(column)
    for t in templates:
        table.add_row(t.name, t.image, t.start_cmd, t.ready_cmd or "-", t.checkpoint_id)
    out.print(table if templates else "no templates; make one with `stasis template create`")


@template_app.command("rm")
def template_rm(name: Annotated[str, typer.Argument(help="Template name.")]) -> None:
    """Remove a template (sandboxes made from it go on)."""
    from ..sdk import Template

    Template.delete(name, client=client())
    out.print(f"removed template {name}")
