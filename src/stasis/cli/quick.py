"""`stasis ls` and `stasis run` in tens of milliseconds: the standard library only, no SDK, no Typer.

These two are typed all day, often in loops, so they should answer like `ls` and `ssh host cmd`. Importing
the SDK (pydantic, httpx, the models) and Typer costs half a second; this path costs Python's start and
`http.client`. It takes only the plain forms: anything else (help, an odd option, no running daemon to
talk to) returns None before any side effect, and the full Typer CLI handles it, starting the daemon if
need be. The full `ls` and `run` render and stream through the functions here too: one behaviour.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import secrets
import signal
import socket
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

RUN_OPTIONS = {"--timeout", "--env", "-e", "--cwd", "--no-stdin", "-n", "--detach", "-d"}
EXIT_CODE_TIMEOUT = 124  # what `timeout(1)` returns
EXIT_CODE_TRUNCATED = 141  # as a shell reports a command whose output pipe broke (128 + SIGPIPE)
CONNECT_TIMEOUT = 5.0
KILL_WAIT = 10.0  # seconds Ctrl-C waits for the daemon to confirm the kill; then the daemon goes on alone
COLUMNS = ("NAME", "ID", "STATUS", "BACKEND", "IMAGE", "CPUS", "MEMORY", "CREATED", "LAST ACTIVITY")
STATUS_COLOUR = {"running": "32", "suspended": "36", "failed": "31", "terminated": "2"}  # ANSI: as the Rich styles
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


class DaemonAnswer(Exception):
    """The daemon refused a request: its message, as the full CLI prints a StasisError, and its details."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}


class Terminated(Exception):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


def main(argv: list[str]) -> int | None:
    """The exit code of `stasis ls|run ...` done here, or None: let the full CLI do it."""
    if argv[:1] == ["ls"]:
        return _ls(argv[1:])
    if argv[:1] == ["run"]:
        return _run(argv[1:])
    return None


# -- the daemon, over its unix socket (or STASIS_URL with STASIS_TOKEN)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("stasis", timeout=CONNECT_TIMEOUT)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        sock.settimeout(None)  # a command may stream for hours
        self.sock = sock


def socket_path() -> Path:
    """Where the daemon listens; as `stasis.paths.Paths.from_env().socket`, without importing more."""
    home = os.environ.get("STASIS_HOME")
    if home:
        return Path(home).absolute() / "stasis.sock"
    from ..paths import Paths  # the default home's rules live there; it imports nothing heavy

    return Paths.from_env().socket


def connection(timeout: float | None = None) -> http.client.HTTPConnection:
    """A connected connection to the daemon whose reads wait ``timeout`` seconds (None: as long as the answer
    takes). OSError when nothing answers."""
    url = daemon_url()
    if url is None:
        conn: http.client.HTTPConnection = _UnixConnection(str(socket_path()))
    else:
        parts = urlsplit(url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname or "localhost", parts.port, timeout=CONNECT_TIMEOUT)
    conn.connect()
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    return conn


def _headers() -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if token := os.environ.get("STASIS_TOKEN"):
        headers["authorization"] = f"Bearer {token}"
    return headers


def daemon_url() -> str | None:
    """A fleet's front door (``STASIS_FLEET``), else a daemon's TCP address (``STASIS_URL``), else None."""
    return os.environ.get("STASIS_FLEET") or os.environ.get("STASIS_URL")


def _prefix() -> str:
    url = daemon_url()
    return urlsplit(url).path.rstrip("/") if url else ""


def request(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> http.client.HTTPResponse:
    """Send one request; an answer that is not a success raises DaemonAnswer with the daemon's message."""
    payload = None if body is None else json.dumps(body).encode()
    conn.request(method, _prefix() + path, body=payload, headers=_headers())
    response = conn.getresponse()
    if 200 <= response.status < 300:
        return response
    text = response.read().decode(errors="replace")
    try:
        payload = json.loads(text)
        message, details = payload["message"], payload.get("details")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, details = text or f"daemon answered HTTP {response.status} {response.reason}", None
    raise DaemonAnswer(str(message), details if isinstance(details, dict) else None)


def _reachable() -> http.client.HTTPConnection | None:
    try:
        return connection()
    except OSError:
        return None  # the full CLI starts the daemon, or says why it cannot


def _report(exc: DaemonAnswer) -> int:
    sys.stderr.write(f"{_paint('error:', '31', sys.stderr)} {printable(exc.message, lines=True)}\n")
    return 1


# -- stasis ls


def _ls(args: list[str]) -> int | None:
    flags = set(args)
    if not flags <= {"--json", "--all", "-a"} or len(flags) != len(args):
        return None
    conn = _reachable()
    if conn is None:
        return None
    query = "?all=true" if flags & {"--all", "-a"} else ""
    try:
        with contextlib.closing(conn):
            sandboxes = json.loads(request(conn, "GET", f"/v1/sandboxes{query}").read())
    except DaemonAnswer as exc:
        return _report(exc)
    if "--json" in flags:
        print(json.dumps(sandboxes, indent=2))
    else:
        sys.stdout.write(sandbox_table(sandboxes))
    return 0


def sandbox_table(sandboxes: list[dict[str, Any]]) -> str:
    """Sandboxes (as the API gives them) as aligned columns; no cell is ever cut."""
    if not sandboxes:
        return "no sandboxes; create one with `stasis create NAME`\n"
    rows = [
        [
            printable(s.get("name") or "-"), printable(s["id"]), s["status"], s["spec"]["backend"],
            printable(s["spec"]["image"]),
            f"{s['spec']['cpus']:g}", f"{s['spec']['memory_mb']} MiB", ago(s.get("created_at")),
            ago(s.get("last_activity")),
        ]
        for s in sandboxes
    ]  # fmt: skip
    titles = COLUMNS
    if any(s.get("node") for s in sandboxes):  # through a fleet's front door: where each one is
        titles = (*COLUMNS, "NODE")
        where = [printable(s.get("node") or ("store" if s.get("moved_to") else "-")) for s in sandboxes]
        rows = [[*row, node] for row, node in zip(rows, where, strict=True)]
    widths = [max(len(cell) for cell in column) for column in zip(titles, *rows, strict=True)]
    header = "  ".join(title.ljust(width) for title, width in zip(titles, widths, strict=True)).rstrip()
    lines = [_paint(header, "1", sys.stdout)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
        cells[2] = _paint(cells[2], STATUS_COLOUR.get(row[2], "33"), sys.stdout)
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def ago(ts: float | None) -> str:
    if not ts:
        return "-"
    seconds = max(0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` as a terminal should show text a sandbox or a client chose: every control character (C0, DEL,
    C1, Unicode's line separators and direction overrides) written out as an escape (``\\x1b``), so none can
    move the cursor, retitle the window or reorder what is shown. ``lines``: newlines and tabs stay."""
    return CONTROL.sub(lambda m: m.group() if lines and m.group() in "\n\t" else _escape(m.group()), text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _paint(text: str, code: str, stream: Any) -> str:
    if not stream.isatty() or os.environ.get("NO_COLOR"):
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


# -- stasis run


def _run(args: list[str]) -> int | None:
    parsed = _parse_run(args)
    if parsed is None:
        return None
    name, argv, options = parsed
    conn = _reachable()
    if conn is None:
        return None
    with contextlib.closing(conn):
        return run_command(name, argv, options, sys.stdin if not options.pop("no_stdin") else None, conn)


def _parse_run(args: list[str]) -> tuple[str, list[str], dict[str, Any]] | None:
    """`[--timeout S] [-e K=V]... [--cwd D] [-n] NAME CMD...`, or None for anything else."""
    options: dict[str, Any] = {"env": {}, "no_stdin": False}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag, sep, value = args[i].partition("=")
        if flag in ("-n", "--no-stdin") and not sep:
            options["no_stdin"] = True
            i += 1
            continue
        if flag not in ("--timeout", "--env", "-e", "--cwd"):
            return None  # --detach, --help, an unknown or combined flag: Typer's
        if not sep:
            if i + 1 >= len(args):
                return None
            value, i = args[i + 1], i + 1
        i += 1
        if flag == "--timeout":
            try:
                options["timeout"] = float(value)
            except ValueError:
                return None
        elif flag == "--cwd":
            options["cwd"] = value
        else:
            key, eq, setting = value.partition("=")
            if not eq or not key:
                return None
            options["env"][key] = setting
    if i >= len(args):
        return None
    name, command = args[i], args[i + 1 :]
    if command[:1] and command[0] in RUN_OPTIONS:
        return None  # an option after the name: the full CLI explains
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return None
    return name, command_argv(command), options


def command_argv(command: list[str]) -> list[str]:
    """One string runs through /bin/sh, as the SDK runs it ('a | b'); several are that argv."""
    return ["/bin/sh", "-c", command[0]] if len(command) == 1 else command


def run_command(
    name: str, argv: list[str], options: dict[str, Any], stdin: Any, conn: http.client.HTTPConnection
) -> int:
    """Stream one command's output here as it comes; its exit code, as `ssh host cmd` returns it."""
    exec_id = f"cli-{secrets.token_hex(6)}"
    body: dict[str, Any] = {"cmd": argv, "env": options.get("env") or {}, "exec_id": exec_id}
    for key in ("cwd", "timeout"):
        if options.get(key) is not None:
            body[key] = options[key]
    if stdin is not None and (data := piped_stdin(stdin)) is not None:
        body["stdin_b64"] = base64.b64encode(data).decode()
    path = f"/v1/sandboxes/{quote(name, safe='')}"
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    # Ctrl-C, even in a process started with SIGINT ignored (a background job, a CI runner): Python then installs
    # no handler of its own, and the command would run on unstopped.
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # However this process ends (Ctrl-C, a closed terminal, kill -9), the command ends with it: as under ssh
        response = request(conn, "POST", f"{path}/exec/stream?kill_on_disconnect=true", body)
        for event in _events(response):
            if "exit_code" in event:
                return exit_code(event, options.get("timeout"))
            for kind, target in (("stdout", sys.stdout), ("stderr", sys.stderr)):
                if kind in event:
                    target.buffer.write(base64.b64decode(event[kind]))
                    target.flush()
        raise DaemonAnswer("the daemon ended the stream before the command's exit; see `stasis daemon status`")
    except DaemonAnswer as exc:
        return _report(exc)
    except (KeyboardInterrupt, Terminated) as stop:
        try:
            unconfirmed = _kill(path, exec_id)
        except (KeyboardInterrupt, Terminated):
            unconfirmed = "interrupted again"
        _say_interrupted(name, exec_id, unconfirmed)
        return 143 if isinstance(stop, Terminated) else 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def _events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    while line := response.readline():
        if not line.strip():
            continue
        event = json.loads(line)
        if "error" in event:
            raise DaemonAnswer(str(event["error"].get("message", event["error"])))
        yield event


def _kill(path: str, exec_id: str) -> str | None:
    """Ask the daemon to kill the command's tree, waiting at most KILL_WAIT for its word. None once it is gone
    (killed, or it had ended); else why that is not known, for the person who pressed Ctrl-C."""
    from ..guest.wire import ErrorKind  # standard library only, as this module

    try:
        with contextlib.closing(connection(timeout=KILL_WAIT)) as conn:
            request(conn, "POST", f"{path}/processes/{exec_id}/signal", {"signal": "SIGKILL"}).read()
    except DaemonAnswer as exc:
        return None if exc.details.get("guest_error") == ErrorKind.PROCESS_EXITED else exc.message
    except TimeoutError:
        return f"no answer from the daemon within {KILL_WAIT:g}s"
    except (OSError, http.client.HTTPException) as exc:
        return f"the daemon could not be asked: {exc}"
    return None


def _say_interrupted(name: str, exec_id: str, unconfirmed: str | None) -> None:
    if unconfirmed is None:
        sys.stderr.write(f"stasis: interrupted; the command ({exec_id}) and its children were killed\n")
        return
    _warn(
        f"stasis: interrupted; the end of the command ({exec_id}) is not confirmed ({printable(unconfirmed)}): the "
        f"daemon kills it once it sees this client gone; `stasis ps {printable(name)}` shows whether it still runs",
        "33",
    )


def exit_code(event: dict[str, Any], timeout: float | None) -> int:
    """The exit event as a shell's exit code; a limit, a timeout or lost output is said on stderr, never silent."""
    if event.get("limit"):
        _warn(f"stasis: {printable(str(event['limit']))}", "33")  # the agent's words
    if event.get("timed_out"):
        after = f" after {timeout:g}s" if timeout else ""
        _warn(f"stasis: command timed out{after} and was killed", "33")
        return EXIT_CODE_TIMEOUT
    lost = [kind for kind in ("stdout", "stderr") if event.get(f"{kind}_truncated")]
    if lost:  # the output above is not all the command wrote
        _warn(f"stasis: this terminal read {' and '.join(lost)} too slowly: the oldest bytes were lost", "31")
        return EXIT_CODE_TRUNCATED
    code = event["exit_code"] if event.get("exit_code") is not None else 1
    return code if code >= 0 else 128 - code


def _warn(message: str, colour: str) -> None:
    sys.stderr.write(_paint(message, colour, sys.stderr) + "\n")


def piped_stdin(stdin: Any) -> bytes | None:
    """What is piped or redirected into this command (a pipe or a file, never a terminal), read to its end."""
    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    return stdin.buffer.read()


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated
