"""`stasis create|ls|run|shell|ps|logs|kill|suspend|resume|info|rm|fork|df`: one sandbox at a time."""

from __future__ import annotations

import base64
import contextlib
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table

from ..backends import BACKENDS, DEFAULT_BACKEND
from ..errors import InvalidRequest, SandboxNotFound
from ..models import ProcessInfo, SandboxInfo, SandboxSpec, build
from ..netpolicy import NetworkPolicy
from ..paths import Paths
from ..sdk import Client, Sandbox
from ..sdk._base import resume_call
from ..sdk._host import disk_usage_call
from . import quick
from ._common import (
    AllowOut,
    DenyOut,
    Json,
    Name,
    ago,
    app,
    client,
    err,
    first_use_builds_shown,
    in_,
    out,
    shown,
    status,
)

SPEC = SandboxSpec.model_fields


@app.command()
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Unique name of the sandbox.")],
    image: Annotated[str, typer.Option(help="Image to start from (`stasis image ls`).")] = SPEC["image"].default,
    cpus: Annotated[float, typer.Option(help="CPU cores (fractions allowed).")] = SPEC["cpus"].default,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory limit in MiB.")] = SPEC["memory_mb"].default,
    disk_mb: Annotated[int, typer.Option("--disk-mb", help="Disk size in MiB (root file system and /tmp).")] = SPEC[
        "disk_mb"
    ].default,
    timeout_secs: Annotated[int, typer.Option("--timeout-secs", help="Idle seconds before the idle action.")] = SPEC[
        "timeout_secs"
    ].default,
    on_idle: Annotated[str | None, typer.Option("--on-idle", help="suspend | terminate")] = None,
    backend: Annotated[
        str | None, typer.Option(help=f"Isolation backend: {' or '.join(BACKENDS)} (default {DEFAULT_BACKEND}).")
    ] = None,
    from_checkpoint: Annotated[
        str | None, typer.Option("--from", help="Checkpoint id or name to create it from.")
    ] = None,
    template: Annotated[
        str | None, typer.Option("--template", help="A template to start from (its server already running).")
    ] = None,
    network: Annotated[
        bool, typer.Option("--network", help="Give it a network device: the internet, or what --allow-out names.")
    ] = False,
    allow_out: AllowOut = None,
    deny_out: DenyOut = None,
    screen: Annotated[
        str | None, typer.Option("--screen", help="A desktop's screen (image desktop), e.g. 1280x800.")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(help="durable (default) | fast: files in gVisor's kernel, faster, lost if killed on the host."),
    ] = None,
    secrets: Annotated[
        list[str] | None,
        typer.Option("--secret", help="A secret it may use (`stasis secret ls`): its env var holds a placeholder."),
    ] = None,
    volumes: Annotated[
        list[str] | None,
        typer.Option("--volume", "-v", help="NAME:/PATH[:ro] mounts a volume (`stasis volume ls`, gVisor); repeatable"),
    ] = None,
    as_json: Json = False,
) -> None:
    """Create a sandbox and start it (from an image, or from a checkpoint with --from)."""
    explicit = {
        key: value
        for key, value in (
            ("image", image),
            ("cpus", cpus),
            ("memory_mb", memory_mb),
            ("disk_mb", disk_mb),
            ("timeout_secs", timeout_secs),
        )
        if (from_checkpoint is None and template is None) or ctx.get_parameter_source(key).name != "DEFAULT"
    }
    if template is not None:
        explicit["template"] = template
    if network or allow_out or deny_out:
        explicit["network"] = build(NetworkPolicy, allow_out=allow_out or [], deny_out=deny_out or [])
    if secrets:
        explicit["secrets"] = secrets
    if volumes:
        explicit["volumes"] = dict(_volume(v) for v in volumes)
    if screen:
        explicit["screen"] = screen
    if storage:
        explicit["storage"] = storage
    with err.status(f"creating sandbox {name}...") as spinner, first_use_builds_shown(spinner):
        started = time.monotonic()
        sbx = Sandbox.create(
            name, on_idle=on_idle, backend=backend, snapshot_id=from_checkpoint, client=client(), **explicit
        )
    if as_json:
        out.print_json(sbx.info().model_dump_json())
    else:
        out.print(f"created [bold]{name}[/bold] ({sbx.id}) in {time.monotonic() - started:.2f}s")


def _volume(text: str) -> tuple[str, dict[str, object]]:
    name, _, rest = text.partition(":")
    path, _, mode = rest.partition(":")
    if not name or not path.startswith("/") or mode not in ("", "ro", "rw"):
        raise typer.BadParameter(f"--volume {text!r}: write NAME:/PATH, or NAME:/PATH:ro for a read-only mount")
    return path, {"name": name, "read_only": mode == "ro"}


@app.command("ls")
def list_sandboxes(
    as_json: Json = False,
    all_: Annotated[bool, typer.Option("--all", "-a", help="Include terminated sandboxes.")] = False,
) -> None:
    """List sandboxes."""
    sandboxes = [s.model_dump(mode="json") for s in Sandbox.list(include_terminated=all_, client=client())]
    if as_json:
        print(json.dumps(sandboxes, indent=2))
        return
    sys.stdout.write(quick.sandbox_table(sandboxes))


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run(
    name: Name,
    command: Annotated[
        list[str], typer.Argument(help="One string: run by /bin/sh, as the SDK does ('a | b'). Several: that argv.")
    ],
    timeout: Annotated[
        float | None, typer.Option(help="Kill the command (and its children) after this many seconds.")
    ] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE, repeatable.")] = None,
    cwd: Annotated[str | None, typer.Option("--cwd", help="Working directory inside the sandbox.")] = None,
    no_stdin: Annotated[bool, typer.Option("--no-stdin", "-n", help="Do not send this stdin (as ssh -n).")] = False,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Start it in the background, print its id, leave it running.")
    ] = False,
) -> None:
    """Run a command like `ssh host cmd`: its output as it comes, piped stdin sent, its exit code returned.

    Options go before NAME (as with `docker exec`); after it, everything is the command. Ctrl-C (or SIGTERM)
    ends the command and its children in the sandbox, and exits 130 (143)."""
    if command and command[0] in quick.RUN_OPTIONS:
        raise InvalidRequest(
            f"{command[0]} is an option of stasis run: options go before the sandbox's name, as with `docker exec` "
            f"(stasis run {command[0]} ... {name} -- CMD); after the name, everything is the command"
        )
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InvalidRequest("no command given; usage: stasis run NAME -- CMD [ARGS...]  or  stasis run NAME 'a | b'")
    argv = quick.command_argv(command)
    environment = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidRequest(f"--env wants KEY=VALUE, got {item!r}")
        environment[key] = value
    sbx = Sandbox.connect(name, client=client())  # starts the daemon if need be
    if detach:
        started = sbx.start_process(argv, env=environment, **({"working_dir": cwd} if cwd else {}))
        out.print(f"started {started.id} (pid {started.pid}); `stasis logs {name} {started.id} -f` follows it")
        return
    options = {"env": environment, "cwd": cwd, "timeout": timeout}
    with contextlib.closing(quick.connection()) as conn:
        raise typer.Exit(quick.run_command(sbx.id, argv, options, None if no_stdin else sys.stdin, conn))


@app.command()
def shell(
    name: Name,
    command: Annotated[list[str] | None, typer.Argument(help="Program instead of the tmux session (after --).")] = None,
) -> None:
    """Attach this terminal to the sandbox: a tmux session named after it. Ctrl-\\ detaches."""
    from ..shell import attach

    info = Sandbox.connect(name, client=client()).info()  # starts the daemon; clear errors for unknown names
    err.print(f"[dim]attached to {info.name or info.id} ({info.status.value}); Ctrl-\\ detaches[/dim]")
    reason = attach(Paths.from_env(), info.id, command or None)
    err.print(f"\r\n[dim]{reason}[/dim]")


@app.command()
def ps(
    name: Name,
    as_json: Json = False,
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Finished ones too.")] = False,
) -> None:
    """Processes started through stasis in a sandbox that are running (--all: finished ones too)."""
    processes = Sandbox.connect(name, client=client()).list_processes()
    if not show_all:
        processes = [p for p in processes if p.status == "running"]
    if as_json:
        print(json.dumps([p.model_dump() for p in processes], indent=2))
        return
    out.print(process_table(processes) if processes else "no processes running"
              + ("" if show_all else " (--all shows finished ones)"))  # fmt: skip


def process_table(processes: list[ProcessInfo]) -> Table:
    table = Table(box=None, header_style="bold")
    for column in ("ID", "PID", "NAME", "STATUS", "EXIT", "STARTED", "COMMAND"):
        table.add_column(column, no_wrap=column != "COMMAND")
    for p in processes:
        exit_code = "" if p.exit_code is None else str(p.exit_code)
        cells = (p.id, str(p.pid), p.name or "", p.status, exit_code, ago(p.started_at), " ".join(p.cmd))
        table.add_row(*(shown(cell) for cell in cells))  # the agent in the sandbox reports them
    return table


def _process_id(sbx: Sandbox, ref: str) -> str:
    """A process by id, or by the name it was started with."""
    for p in sbx.list_processes():
        if ref in (p.id, p.name):
            return p.id
    return ref


@app.command()
def logs(
    name: Name,
    process: Annotated[str, typer.Argument(help="Process id or name.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until it exits.")] = False,
    stderr: Annotated[bool, typer.Option("--stderr", help="The error stream instead of stdout.")] = False,
) -> None:
    """Output of a background process."""
    sbx = Sandbox.connect(name, client=client())
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
    name: Name,
    process: Annotated[str, typer.Argument(help="Process id or name.")],
    signal_name: Annotated[str, typer.Option("--signal", "-s", help="e.g. SIGTERM, SIGINT, SIGKILL.")] = "SIGKILL",
) -> None:
    """Send a signal to a background process (and its children)."""
    sbx = Sandbox.connect(name, client=client())
    info = sbx.send_signal(_process_id(sbx, process), signal_name)
    out.print(f"sent {signal_name.upper()} to {info.id} (pid {info.pid})")


def _transition(name: str, verb: str, act: Callable[[Sandbox], SandboxInfo]) -> None:
    sbx = Sandbox.connect(name, client=client())
    started = time.monotonic()  # this command's own time: the record's may be an earlier transition's
    with err.status(f"{verb.removesuffix('e')}ing {name}..."):
        act(sbx)
    out.print(f"{verb.removesuffix('e')}ed [bold]{name}[/bold] in {time.monotonic() - started:.3f}s")


@app.command()
def suspend(
    name: Name,
    files_only: Annotated[
        bool, typer.Option("--files-only", help="Keep its files only: the next resume boots it again with them.")
    ] = False,
) -> None:
    """Suspend a sandbox to disk: memory, processes and files. Nothing of it keeps running."""
    _transition(name, "suspend", lambda sbx: sbx.suspend(keep_memory=False if files_only else None))


@app.command()
def resume(name: Name) -> None:
    """Resume a suspended sandbox exactly where it was; with a remote store, also one suspended on another
    node and pushed there (it is taken over and fetched first)."""
    started = time.monotonic()
    with err.status(f"resuming {name}..."):
        client().call(resume_call(name))
    out.print(f"resumed [bold]{name}[/bold] in {time.monotonic() - started:.3f}s")


@app.command()
def info(name: Name, as_json: Json = False) -> None:
    """Show one sandbox."""
    data = Sandbox.connect(name, client=client()).info()
    if as_json:
        print(data.model_dump_json(indent=2))
        return
    out.print(info_table(data))


def info_table(data: SandboxInfo) -> Table:
    table = Table(box=None, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    network = data.spec.network.describe() if data.spec.network else "none (no network device)"
    rows: list[tuple[str, str]] = [  # Rich markup: what a client or a sandbox chose goes through shown()
        ("name", shown(data.name or "-")),
        ("id", data.id),
        ("status", status(data)),
        ("image", shown(data.spec.image)),
        ("backend", data.spec.backend),
        ("cpus / memory / disk", f"{data.spec.cpus:g} / {data.spec.memory_mb} MiB / {data.spec.disk_mb} MiB"),
        ("storage", data.spec.storage),
        ("network", shown(network)),
        ("created", datetime.fromtimestamp(data.created_at).isoformat(sep=" ", timespec="seconds")),
        ("last activity", ago(data.last_activity)),
        ("idle timeout", f"{data.spec.timeout_secs}s" if data.spec.timeout_secs else "never"),
    ]
    if data.idle_action_at:
        rows.append((f"idle {data.idle_action}", in_(data.idle_action_at)))
    for key, value in sorted(data.runtime.items()):
        rows.append((shown(key.replace("_", " ")), shown(value)))
    if data.last_suspend_seconds is not None:
        rows.append(("last suspend", f"{data.last_suspend_seconds:.3f}s"))
    if data.last_resume_seconds is not None:
        rows.append(("last resume", f"{data.last_resume_seconds:.3f}s"))
    if data.error:
        rows.append(("error", f"[red]{shown(data.error, lines=True)}[/red]"))
    for key, value in rows:
        table.add_row(key, value)
    return table


@app.command("rm")
def remove(
    names: Annotated[list[str], typer.Argument(help="Sandbox names or ids.")],
    force: Annotated[
        bool, typer.Option("--force", "-f", help="A name that is not there is no error (as `docker rm -f`).")
    ] = False,
) -> None:
    """Terminate sandboxes (running, suspended or failed) and delete their files; several in one call: a rollout's
    forks."""
    connection = client()
    if force:
        names = [name for name in names if _exists(name, connection)]
        if not names:
            out.print("nothing to remove")
            return
    if len(names) == 1:
        with err.status(f"removing {names[0]}..."):
            try:
                Sandbox.connect(names[0], client=connection).terminate()
            except SandboxNotFound:
                if not force:
                    raise
                out.print(f"no sandbox {shown(names[0])}: nothing to remove")  # gone meanwhile
                return
        out.print(f"removed [bold]{shown(names[0])}[/bold]")
        return
    with err.status(f"removing {len(names)} sandboxes..."):
        removed = Sandbox.terminate_all(names, client=connection)
    out.print(f"removed {len(removed)} sandboxes")


def _exists(name: str, connection: Client) -> bool:
    try:
        Sandbox.connect(name, client=connection)
    except SandboxNotFound:
        err.print(f"no sandbox {shown(name)}: nothing to remove")
        return False
    return True


@app.command()
def fork(
    name: Name,
    count: Annotated[int, typer.Option("--count", "-n", help="How many copies.")] = 1,
) -> None:
    """Live copies of a running sandbox, or sandboxes from a checkpoint (rollouts): they continue from its instant
    (memory, processes, files), then diverge. Through a fleet, spread over its nodes."""
    daemon = client()
    with err.status(f"forking {name} x{count}..."):
        started = time.monotonic()
        try:
            children = Sandbox.connect(name, client=daemon).copy(times=count)
        except SandboxNotFound:
            children = Sandbox.fork(name, count, client=daemon)  # not a sandbox: a checkpoint's name or id
    err.print(f"{count} fork(s) of {name} in {time.monotonic() - started:.2f}s")
    for child in children:
        print(child.name or child.id)


@app.command()
def df(as_json: Json = False) -> None:
    """Disk used by sandboxes, checkpoints and images."""
    usage = client().call(disk_usage_call())
    if as_json:
        print(usage.model_dump_json(indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("KIND", "COUNT", "SIZE"):
        table.add_column(column)
    table.add_row("sandboxes", str(len(usage.sandboxes)), f"{usage.sandboxes_bytes / 1e6:.1f} MB")
    table.add_row("checkpoints", str(len(usage.checkpoints)), f"{usage.checkpoints_bytes / 1e6:.1f} MB")
    table.add_row("images", "", f"{usage.images_bytes / 1e6:.1f} MB")
    if usage.remote:
        limit = f" of {usage.remote_cache_limit_bytes / 1e6:.0f} MB" if usage.remote_cache_limit_bytes else ""
        cached = f"{usage.remote_cache_bytes / 1e6:.1f} MB{limit}"
        table.add_row("remote cache", str(usage.remote_cache_chunks), cached)
    out.print(table)
    out.print(f"[dim]{usage.shared_note}[/dim]")
    if usage.remote:
        out.print(f"[dim]remote store: {usage.remote} (pieces fetched from it are cached here, least recently "
                  "used out first: STASIS_REMOTE_CACHE_MB)[/dim]")  # fmt: skip
