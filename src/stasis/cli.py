"""`stasis`: the command line. A thin shell over the SDK."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .errors import InvalidRequest, StasisError
from .models import DiskUsage, SandboxInfo
from .paths import Paths
from .sdk import Client, Sandbox
from .sdk._sandbox import EXIT_CODE_TIMEOUT

app = typer.Typer(
    help="Stateful sandboxes for AI agents: suspend a machine with its processes, resume it exactly where it was.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
image_app = typer.Typer(help="Root filesystem images.", no_args_is_help=True)
app.add_typer(image_app, name="image")
agent_app = typer.Typer(help="The agent harness: a tool-calling loop that runs inside a sandbox.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")
checkpoints_app = typer.Typer(help="List (the default) and remove checkpoints.", invoke_without_command=True)
app.add_typer(checkpoints_app, name="checkpoints")

out = Console()
err = Console(stderr=True)

Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _client() -> Client:
    return Client()


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    seconds = max(0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _in(ts: float) -> str:
    seconds = max(0, ts - time.time())
    return f"in {seconds:.0f}s" if seconds < 120 else f"in {seconds / 60:.0f}m"


STATUS_STYLE = {"running": "green", "suspended": "cyan", "failed": "red", "terminated": "dim"}


def _status(info: SandboxInfo) -> str:
    style = STATUS_STYLE.get(info.status.value, "yellow")
    return f"[{style}]{info.status.value}[/{style}]"


# ------------------------------------------------------------ sandboxes


@app.command()
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Unique name of the sandbox.")],
    image: Annotated[str, typer.Option(help="Image to start from (`stasis image ls`).")] = "default",
    cpus: Annotated[float, typer.Option(help="CPU cores (fractions allowed).")] = 1.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory limit in MiB.")] = 1024,
    timeout_secs: Annotated[int, typer.Option("--timeout-secs", help="Idle seconds before the idle action.")] = 600,
    on_idle: Annotated[str | None, typer.Option("--on-idle", help="suspend | terminate")] = None,
    backend: Annotated[
        str | None, typer.Option(help="Isolation backend: gvisor (default) or microvm (QEMU, its own Linux kernel).")
    ] = None,
    from_checkpoint: Annotated[
        str | None, typer.Option("--from", help="Checkpoint id or name to create it from.")
    ] = None,
    as_json: Json = False,
) -> None:
    """Create a sandbox and start it (from an image, or from a checkpoint with --from)."""
    explicit = {
        key: value
        for key, value in (("image", image), ("cpus", cpus), ("memory_mb", memory_mb), ("timeout_secs", timeout_secs))
        if from_checkpoint is None or ctx.get_parameter_source(key).name != "DEFAULT"
    }
    with err.status(f"creating sandbox {name}..."):
        started = time.monotonic()
        sbx = Sandbox.create(
            name, on_idle=on_idle, backend=backend, snapshot_id=from_checkpoint, client=_client(), **explicit
        )
    if as_json:
        out.print_json(sbx.info().model_dump_json())
    else:
        out.print(f"created [bold]{name}[/bold] ({sbx.id}) in {time.monotonic() - started:.2f}s")


@app.command("ls")
def list_sandboxes(
    as_json: Json = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include terminated sandboxes.")] = False,
) -> None:
    """List sandboxes."""
    sandboxes = Sandbox.list(include_terminated=all_, client=_client())
    if as_json:
        print(json.dumps([s.model_dump(mode="json") for s in sandboxes], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "ID", "STATUS", "IMAGE", "CPUS", "MEMORY", "CREATED", "LAST ACTIVITY"):
        table.add_column(column, no_wrap=True)
    for s in sandboxes:
        table.add_row(
            s.name or "-", s.id, _status(s), s.spec.image, f"{s.spec.cpus:g}", f"{s.spec.memory_mb} MiB",
            _ago(s.created_at), _ago(s.last_activity),
        )  # fmt: skip
    out.print(table if sandboxes else "no sandboxes; create one with `stasis create NAME`")


@app.command()
def run(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    command: Annotated[list[str], typer.Argument(help="Command and arguments (after --).")],
    timeout: Annotated[
        float | None, typer.Option(help="Kill the command (and its children) after this many seconds.")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory inside the sandbox.")] = None,
) -> None:
    """Run a command to completion; print its output and exit with its exit code."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InvalidRequest("no command given; usage: stasis run NAME -- CMD [ARGS...]")
    environment = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--env wants KEY=VALUE, got {item!r}")
        environment[key] = value
    sbx = Sandbox.connect(name, client=_client())
    code = 0
    for event in sbx.stream(command, env=environment, working_dir=cwd, timeout=timeout):  # printed as it comes
        if event.kind == "exit":
            if event.timed_out:
                err.print(f"[yellow]stasis: command timed out after {timeout:g}s and was killed[/yellow]")
                raise typer.Exit(EXIT_CODE_TIMEOUT)
            code = event.exit_code if event.exit_code is not None else 1
        else:
            target = sys.stdout if event.kind == "stdout" else sys.stderr
            target.buffer.write(event.data)
            target.flush()
    raise typer.Exit(code if code >= 0 else 128 - code)


@app.command()
def shell(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    command: Annotated[list[str] | None, typer.Argument(help="Program instead of the tmux session (after --).")] = None,
) -> None:
    """Attach this terminal to the sandbox: a tmux session named after it. Ctrl-\\ detaches."""
    from .shell import attach

    info = Sandbox.connect(name, client=_client()).info()  # starts the daemon; clear errors for unknown names
    err.print(f"[dim]attached to {info.name or info.id} ({info.status.value}); Ctrl-\\ detaches[/dim]")
    reason = attach(Paths.from_env(), info.id, command or None)
    err.print(f"\r\n[dim]{reason}[/dim]")


@app.command()
def ps(name: Annotated[str, typer.Argument(help="Sandbox name or id.")], as_json: Json = False) -> None:
    """Processes started through stasis in a sandbox."""
    processes = Sandbox.connect(name, client=_client()).list_processes()
    if as_json:
        print(json.dumps([p.model_dump() for p in processes], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "PID", "NAME", "STATUS", "EXIT", "STARTED", "COMMAND"):
        table.add_column(column, no_wrap=column != "COMMAND")
    for p in processes:
        exit_code = "" if p.exit_code is None else str(p.exit_code)
        table.add_row(p.id, str(p.pid), p.name or "", p.status, exit_code, _ago(p.started_at), " ".join(p.cmd)[:80])
    out.print(table if processes else "no processes")


def _process_id(sbx: Sandbox, ref: str) -> str:
    """A process by id, or by the name it was started with."""
    for p in sbx.list_processes():
        if ref in (p.id, p.name):
            return p.id
    return ref


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    process: Annotated[str, typer.Argument(help="Process id or name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it exits.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="The error stream instead of stdout.")] = False,
) -> None:
    """Output of a background process."""
    sbx = Sandbox.connect(name, client=_client())
    process_id = _process_id(sbx, process)
    stream = "stderr" if stderr else "stdout"
    if follow:
        for _offset, data in sbx.follow_output(process_id, stream=stream):
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        return
    offset = 0
    while True:
        chunk = sbx.process_output(process_id, stream=stream, offset=offset)
        sys.stdout.buffer.write(base64.b64decode(chunk.data_b64))
        if chunk.next_offset == offset or chunk.eof:
            break
        offset = chunk.next_offset
    sys.stdout.flush()


@app.command()
def kill(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    process: Annotated[str, typer.Argument(help="Process id or name.")],
    signal_name: Annotated[str, typer.Option("--signal", "-s", help="e.g. SIGTERM, SIGINT, SIGKILL.")] = "SIGKILL",
) -> None:
    """Send a signal to a background process (and its children)."""
    sbx = Sandbox.connect(name, client=_client())
    info = sbx.send_signal(_process_id(sbx, process), signal_name)
    out.print(f"sent {signal_name.upper()} to {info.id} (pid {info.pid})")


@app.command()
def suspend(name: Annotated[str, typer.Argument(help="Sandbox name or id.")]) -> None:
    """Suspend a sandbox to disk: memory, processes and files. Nothing of it keeps running."""
    sbx = Sandbox.connect(name, client=_client())
    with err.status(f"suspending {name}..."):
        info = sbx.suspend()
    took = f" in {info.last_suspend_seconds:.3f}s" if info.last_suspend_seconds else ""
    out.print(f"suspended [bold]{name}[/bold]{took}")


@app.command()
def resume(name: Annotated[str, typer.Argument(help="Sandbox name or id.")]) -> None:
    """Resume a suspended sandbox exactly where it was."""
    sbx = Sandbox.connect(name, client=_client())
    with err.status(f"resuming {name}..."):
        info = sbx.resume()
    took = f" in {info.last_resume_seconds:.3f}s" if info.last_resume_seconds else ""
    out.print(f"resumed [bold]{name}[/bold]{took}")


@app.command()
def info(name: Annotated[str, typer.Argument(help="Sandbox name or id.")], as_json: Json = False) -> None:
    """Show one sandbox."""
    data = Sandbox.connect(name, client=_client()).info()
    if as_json:
        print(data.model_dump_json(indent=2))
        return
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, Any]] = [
        ("name", data.name or "-"),
        ("id", data.id),
        ("status", _status(data)),
        ("image", data.spec.image),
        ("backend", data.spec.backend),
        ("cpus / memory", f"{data.spec.cpus:g} / {data.spec.memory_mb} MiB"),
        ("network", "on" if data.spec.network else "off"),
        ("created", datetime.fromtimestamp(data.created_at).isoformat(sep=" ", timespec="seconds")),
        ("last activity", _ago(data.last_activity)),
        ("idle timeout", f"{data.spec.timeout_secs}s" if data.spec.timeout_secs else "never"),
    ]
    if data.idle_action_at:
        rows.append((f"idle {data.idle_action}", _in(data.idle_action_at)))
    for key, value in sorted(data.runtime.items()):
        rows.append((key.replace("_", " "), value))
    if data.last_suspend_seconds is not None:
        rows.append(("last suspend", f"{data.last_suspend_seconds:.3f}s"))
    if data.last_resume_seconds is not None:
        rows.append(("last resume", f"{data.last_resume_seconds:.3f}s"))
    if data.error:
        rows.append(("error", f"[red]{data.error}[/red]"))
    for key, value in rows:
        table.add_row(key, str(value))
    out.print(table)


@app.command("rm")
def remove(names: Annotated[list[str], typer.Argument(help="Sandbox names or ids.")]) -> None:
    """Terminate sandboxes and delete their files."""
    client = _client()
    for name in names:
        with err.status(f"removing {name}..."):
            Sandbox.connect(name, client=client).terminate()
        out.print(f"removed [bold]{name}[/bold]")


@app.command()
def checkpoint(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    type_: Annotated[str, typer.Option("--type", help="memory (processes too) | filesystem (files only)")] = "memory",
    checkpoint_name: Annotated[str | None, typer.Option("--name", help="A unique name for the checkpoint.")] = None,
    ttl_secs: Annotated[int | None, typer.Option("--ttl-secs", help="Delete it after this long.")] = None,
) -> None:
    """Checkpoint a sandbox; it keeps running. Prints the checkpoint id."""
    sbx = Sandbox.connect(name, client=_client())
    with err.status(f"checkpointing {name} ({type_})..."):
        started = time.monotonic()
        info = sbx.checkpoint(type_, name=checkpoint_name, ttl_secs=ttl_secs)
    err.print(f"{type_} checkpoint of {name}: {info.size_bytes / 1e6:.1f} MB in {time.monotonic() - started:.2f}s")
    print(info.id)


@checkpoints_app.callback()
def checkpoints(ctx: typer.Context, as_json: Json = False) -> None:
    """List checkpoints."""
    if ctx.invoked_subcommand is not None:
        return
    items = Sandbox.list_checkpoints(client=_client())
    if as_json:
        print(json.dumps([c.model_dump(mode="json") for c in items], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "TYPE", "FROM", "SIZE", "CREATED", "EXPIRES"):
        table.add_column(column, no_wrap=True)
    for c in items:
        expires = _in(c.expires_at) if c.expires_at else "never"
        table.add_row(
            c.id, c.name or "-", c.type.value, c.sandbox_name or c.sandbox_id, f"{c.size_bytes / 1e6:.1f} MB",
            _ago(c.created_at), expires,
        )  # fmt: skip
    out.print(table if items else "no checkpoints; make one with `stasis checkpoint NAME`")


@checkpoints_app.command("rm")
def checkpoints_rm(ids: Annotated[list[str], typer.Argument(help="Checkpoint ids or names.")]) -> None:
    """Delete checkpoints."""
    client = _client()
    for checkpoint_id in ids:
        Sandbox.delete_checkpoint(checkpoint_id, client=client)
        out.print(f"deleted checkpoint {checkpoint_id}")


@app.command()
def fork(
    name: Annotated[str, typer.Argument(help="Sandbox name or id.")],
    count: Annotated[int, typer.Option("--count", "-n", help="How many copies.")] = 1,
) -> None:
    """Live copies of a running sandbox: they continue from now (memory, processes, files), then diverge."""
    sbx = Sandbox.connect(name, client=_client())
    with err.status(f"forking {name} x{count}..."):
        started = time.monotonic()
        children = sbx.copy(times=count)
    err.print(f"{count} fork(s) of {name} in {time.monotonic() - started:.2f}s")
    for child in children:
        print(child.name or child.id)


@app.command()
def df(as_json: Json = False) -> None:
    """Disk used by sandboxes, checkpoints and images."""
    usage = DiskUsage.model_validate(_client().json("GET", "/v1/df"))
    if as_json:
        print(usage.model_dump_json(indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("KIND", "COUNT", "SIZE"):
        table.add_column(column)
    table.add_row("sandboxes", str(len(usage.sandboxes)), f"{usage.sandboxes_bytes / 1e6:.1f} MB")
    table.add_row("checkpoints", str(len(usage.checkpoints)), f"{usage.checkpoints_bytes / 1e6:.1f} MB")
    table.add_row("images", "", f"{usage.images_bytes / 1e6:.1f} MB")
    out.print(table)
    out.print(f"[dim]{usage.shared_note}[/dim]")


# ------------------------------------------------------------ agent


def _runner(model: str | None = None):  # type: ignore[no-untyped-def]
    from .agent import AgentRunner, Journal, OpenAIModel

    journal = Journal(Paths.from_env().agent_journal)
    return AgentRunner(journal, OpenAIModel(model=model), _client(), on_event=_show_agent_event), journal


def _show_agent_event(kind: str, data: dict[str, Any]) -> None:
    if kind == "model":
        message = data["message"]
        if message.get("content"):
            out.print(f"[bold]assistant[/bold] ({data['seconds']:.1f}s): {message['content']}", highlight=False)
    elif kind == "tool_call":
        out.print(f"[cyan]→ {data['name']}[/cyan] {str(data['arguments'])[:200]}", highlight=False)
    elif kind == "tool_result":
        lines = data["content"].splitlines() or [""]
        more = f" [dim](+{len(lines) - 1} lines, {data['seconds']:.2f}s)[/dim]" if len(lines) > 1 else ""
        out.print(f"[green]← {lines[0][:200]}[/green]{more}", highlight=False)
    elif kind == "final":
        style = "green" if data["status"] == "completed" else "red"
        out.print(f"[{style}]■ {data['status']}[/{style}]: {data['text']}", highlight=False)


def _show_run(record: Any) -> None:
    err.print(f"run [bold]{record.id}[/bold] on {record.sandbox}: {record.status}")
    if record.status == "running":
        raise typer.Exit(3)
    if record.status != "completed":
        raise typer.Exit(1)


@agent_app.command("run")
def agent_run(
    task: Annotated[str, typer.Argument(help="What the agent should do.")],
    sandbox: Annotated[str, typer.Option("--sandbox", "-s", help="Sandbox name or id.")],
    model: Annotated[str | None, typer.Option(help="Model name (default: $STASIS_MODEL).")] = None,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Model calls at most.")] = 30,
) -> None:
    """Run the agent on a task, streaming its steps. Needs OPENAI_BASE_URL / OPENAI_API_KEY."""
    runner, journal = _runner(model)
    record = runner.start(sandbox, task, max_steps=max_steps)
    journal.close()
    _show_run(record)


@agent_app.command("resume")
def agent_resume(run_id: Annotated[str, typer.Argument(help="The run to continue.")]) -> None:
    """Continue a run that was interrupted (killed, crashed), without repeating any step."""
    runner, journal = _runner(None)
    record = journal.run(run_id)
    runner.model.model = record.model
    record = runner.resume(run_id)
    journal.close()
    _show_run(record)


@agent_app.command("ls")
def agent_ls(as_json: Json = False) -> None:
    """List agent runs."""
    from .agent import Journal

    runs = Journal(Paths.from_env().agent_journal).runs()
    if as_json:
        print(json.dumps([r.as_dict() for r in runs], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATUS", "SANDBOX", "MODEL", "TASK", "STARTED"):
        table.add_column(column, no_wrap=column != "TASK")
    for r in runs:
        table.add_row(r.id, r.status, r.sandbox, r.model, r.task[:60], _ago(r.created_at))
    out.print(table if runs else "no agent runs; start one with `stasis agent run --sandbox NAME TASK`")


@agent_app.command("log")
def agent_log(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """The transcript of a run."""
    from .agent import Journal

    journal = Journal(Paths.from_env().agent_journal)
    record = journal.run(run_id)
    out.print(f"[bold]{record.id}[/bold] on {record.sandbox} ({record.model}): {record.status}")
    out.print(f"[bold]task[/bold]: {record.task}", highlight=False)
    for event in journal.events(run_id):
        if event.kind == "model_response":
            _show_agent_event("model", {"message": event.payload["message"], "seconds": event.seconds or 0})
        elif event.kind == "tool_call":
            _show_agent_event("tool_call", event.payload)
        elif event.kind == "tool_result":
            _show_agent_event("tool_result", {**event.payload, "seconds": event.seconds or 0})
    if record.final is not None or record.error:
        _show_agent_event("final", {"status": record.status, "text": record.final or record.error})
    if record.checkpoints:
        out.print(f"checkpoints: {', '.join(record.checkpoints)}")


# ------------------------------------------------------------ daemon


@app.command()
def serve(
    tcp: Annotated[str | None, typer.Option(help="Also listen on HOST:PORT (needs STASIS_TOKEN).")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING.")] = "INFO",
) -> None:
    """Run the daemon in the foreground (the CLI and SDK start it on demand)."""
    from .daemon.server import serve as run_server

    run_server(Paths.from_env(), tcp=tcp, token=os.environ.get("STASIS_TOKEN"), log_level=log_level.upper())


# ------------------------------------------------------------ the host


@app.command()
def doctor(as_json: Json = False) -> None:
    """Check which backends and accelerators work on this host, and why (no daemon needed)."""
    from .doctor import check_host

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
    images = report["images"]
    out.print(f"images: {', '.join(images) if images else 'none built; run `stasis image build default`'}")
    if not any(r["works"] for r in report["backends"].values()):
        raise typer.Exit(1)


# ------------------------------------------------------------ images


@image_app.command("ls")
def image_ls(as_json: Json = False) -> None:
    """List built images."""
    from .images import ImageStore

    images = ImageStore(Paths.from_env().images).list()
    if as_json:
        print(json.dumps([i.model_dump() for i in images], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "KEY", "SIZE", "BUILT", "PACKAGES"):
        table.add_column(column)
    for i in images:
        table.add_row(i.name, i.key, f"{i.size_bytes / 1e6:.0f} MB", _ago(i.built_at), ", ".join(i.packages))
    out.print(table if images else "no images; build one with `stasis image build default`")


@image_app.command("build")
def image_build(
    name: Annotated[str, typer.Argument(help="Recipe name.")] = "default",
    force: Annotated[bool, typer.Option(help="Rebuild even if cached.")] = False,
) -> None:
    """Build an image from its recipe (cached by the recipe's hash)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .images import ImageStore

    store = ImageStore(Paths.from_env().images)
    recipe = store.recipe(name)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err) as progress:
        task = progress.add_task(f"building image {recipe.key}", total=None)
        info = store.build(
            name,
            progress=lambda line: progress.update(task, description=f"{recipe.key}: {line[:90]}"),
            force=force,
        )
    out.print(f"image [bold]{info.key}[/bold]: {info.size_bytes / 1e6:.0f} MB, built in {info.build_seconds:.1f}s")


def main() -> None:
    try:
        app()
    except StasisError as exc:
        err.print(f"[red]error:[/red] {exc.message}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
