"""The verbs a person reaches for: `stasis start` (a named background process), `stasis cp` (both ways, like
`docker cp`), and `stasis daemon status|stop|restart`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Annotated

import typer

from ..errors import DaemonUnavailable, FileNotFound, InvalidRequest
from ..paths import Paths
from ..sdk import Sandbox
from ..sdk._daemon import start_daemon
from ._common import Name, app, client, err, out

daemon_app = typer.Typer(help="The daemon itself: whether it runs, stopping and restarting it.")
app.add_typer(daemon_app, name="daemon")
STOP_TIMEOUT = 60.0  # seconds for a daemon to stop after SIGTERM (it closes its sandboxes' channels first)


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def start(
    name: Name,
    command: Annotated[list[str], typer.Argument(help="One string: run by /bin/sh. Several: that argv.")],
    process_name: Annotated[
        str | None, typer.Option("--name", help="Its name, for `stasis logs` and `stasis kill`.")
    ] = None,
) -> None:
    """Start a background process (options before NAME); `stasis logs NAME ID -f` follows it."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InvalidRequest("no command given; usage: stasis start [--name web] NAME -- CMD [ARGS...]")
    argv = ["/bin/sh", "-c", command[0]] if len(command) == 1 else command
    sbx = Sandbox.connect(name, client=client())
    started = sbx.start_process(argv, **({"name": process_name} if process_name else {}))
    label = process_name or started.id
    out.print(f"started {label} (id {started.id}, pid {started.pid}); `stasis logs {name} {label} -f` follows it")


@app.command()
def cp(
    source: Annotated[str, typer.Argument(help="A local path, or NAME:PATH in a sandbox.")],
    destination: Annotated[str, typer.Argument(help="A local path, or NAME:PATH in a sandbox.")],
) -> None:
    """Copy a file or a directory (as a tar, whole or not at all) into or out of a sandbox, like `docker cp`."""
    remote_source, remote_destination = _remote(source), _remote(destination)
    if (remote_source is None) == (remote_destination is None):
        raise InvalidRequest("one side of `stasis cp` is NAME:PATH in a sandbox, the other a local path")
    if remote_destination is not None:
        name, path = remote_destination
        local = Path(source)
        sbx = Sandbox.connect(name, client=client())
        if local.is_dir():
            sbx.upload_dir(local, path, replace=True)
        elif local.is_file():
            sbx.write_file(path, local.read_bytes(), mode=local.stat().st_mode & 0o777)
        else:
            raise FileNotFound(f"{local} does not exist here")
        out.print(f"copied {local} to {name}:{path}")
        return
    assert remote_source is not None
    name, path = remote_source
    sbx = Sandbox.connect(name, client=client())
    local = Path(destination)
    if sbx.stat(path).type == "directory":
        sbx.download_dir(path, local, replace=True)
    else:
        target = local / Path(path).name if local.is_dir() else local
        target.write_bytes(sbx.read_file(path))
        local = target
    out.print(f"copied {name}:{path} to {local}")


def _remote(spec: str) -> tuple[str, str] | None:
    """NAME:PATH, where PATH is absolute (so a local `./a:b` or `/x:y` is never taken for one)."""
    name, sep, path = spec.partition(":")
    if not sep or not name or "/" in name or not path.startswith("/"):
        return None
    return name, path


@daemon_app.command("status")
def daemon_status() -> None:
    """Whether the daemon runs: its pid, socket and home; exit 1 if it does not."""
    paths = Paths.from_env()
    pid = _pid(paths)
    if pid is None:
        err.print(f"the daemon for {paths.home} is not running (the CLI and SDK start it on demand)")
        raise typer.Exit(1)
    out.print(f"running: pid {pid}, socket {paths.socket}, home {paths.home}")


@daemon_app.command("stop")
def daemon_stop() -> None:
    """Stop the daemon (SIGTERM): sandboxes keep running and are adopted by the next daemon."""
    paths = Paths.from_env()
    pid = _pid(paths)
    if pid is None:
        out.print("the daemon is not running")
        return
    _stop(paths, pid)
    out.print(f"stopped the daemon (pid {pid}); its sandboxes keep running and are adopted by the next one")


@daemon_app.command("restart")
def daemon_restart() -> None:
    """Stop the daemon if it runs, start it again and wait until it answers."""
    paths = Paths.from_env()
    if (pid := _pid(paths)) is not None:
        _stop(paths, pid)
    start_daemon(paths)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _pid(paths) is None or not paths.socket.exists():
        if time.monotonic() > deadline:
            raise DaemonUnavailable(f"the daemon did not start within {STOP_TIMEOUT:.0f}s; see {paths.logfile}")
        time.sleep(0.05)
    client().json("GET", "/v1/health")
    out.print(f"restarted: pid {_pid(paths)}")


def _pid(paths: Paths) -> int | None:
    """The running daemon's pid from its pidfile (a pidfile whose process is gone counts as none)."""
    try:
        pid = int(paths.pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _stop(paths: Paths, pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _pid(paths) == pid:
        if time.monotonic() > deadline:
            raise DaemonUnavailable(f"the daemon (pid {pid}) did not stop within {STOP_TIMEOUT:.0f}s after SIGTERM")
        time.sleep(0.05)
