"""The guest protocol as data: one dataclass per operation, its result, and the error kinds.

Standard library only: this file is shipped into every sandbox beside the agent, and
the host imports it as ``stasis.guest.protocol``. Host and agent build and read every
message through these classes; nothing else names an operation.

Wire format (newline-delimited JSON, one request or reply per line)::

    -> {"id": "a1", "op": "exec", "args": {"cmd": ["echo", "hi"]}}
    <- {"id": "a1", "ok": true, "result": {"exit_code": 0, "stdout": "aGkK", ...}}
    <- {"id": "a2", "ok": false, "error": {"type": "FileNotFoundError", "message": "..."}}

Bytes travel base64-encoded. Field names are the wire names and never change
meaning: a sandbox restored from an old MEMORY checkpoint runs the agent it was
saved with, so new fields are optional and unknown ones are ignored on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .protocol_files import (  # noqa: F401 (re-exported: P.ReadFile, P.FileStat, ...)
    DeleteFile,
    DirListing,
    ExtractTar,
    Fifo,
    FifoList,
    FileData,
    FileStat,
    ListDir,
    ListFifos,
    MakeDir,
    PackChanges,
    PackTar,
    PathResult,
    ReadFile,
    ReadWatch,
    StartWatch,
    StatFile,
    StopWatch,
    WatchEvent,
    WatchEvents,
    WatchInfo,
    WriteFile,
)  # fmt: skip

# The protocol's vocabulary (re-exported: host and agent write P.ErrorKind, P.encode, ...)
from .wire import CANCEL_PREFIX, VERSION, Empty, ErrorKind, Operation, cancel_line, decode, encode  # noqa: F401

# ---------------------------------------------------------------- results


@dataclass
class HealthInfo:
    version: int
    pid: int
    uptime: float
    boot_id: str = ""  # empty from agents older than VERSION 2


@dataclass
class IdentityInfo:
    hostname: str
    time: float
    boot_id: str = ""


@dataclass
class ExecResult:
    """A finished run; ``status`` is "running" (and nothing else is set) for a run still going."""

    exec_id: str
    status: str = "exited"
    exit_code: int | None = None
    timed_out: bool = False
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration: float = 0.0
    limit: str | None = None  # a sandbox limit the command ran into (processes, memory), if any


@dataclass
class ProcessState:
    id: str
    pid: int
    name: str | None
    cmd: list[str]
    status: str  # "running" | "exited"
    exit_code: int | None
    started_at: float
    finished_at: float | None
    stdout_bytes: int
    stderr_bytes: int
    limit: str | None = None  # as in ExecResult


@dataclass
class ProcessListing:
    processes: list[ProcessState] = field(default_factory=list, metadata={"of": ProcessState})


@dataclass
class StreamChunk:
    data: str
    offset: int
    next_offset: int
    lost: int
    eof: bool


@dataclass
class ProcessStreams:
    exit_code: int | None
    timed_out: bool
    stdout: StreamChunk = field(metadata={"of": StreamChunk})
    stderr: StreamChunk = field(metadata={"of": StreamChunk})
    limit: str | None = None  # as in ExecResult


@dataclass
class OutputChunk:
    data: str
    offset: int
    next_offset: int
    lost: int
    eof: bool
    exit_code: int | None


@dataclass
class PtySize:
    cols: int
    rows: int


# ---------------------------------------------------------------- operations: the agent itself


@dataclass
class Health(Operation[HealthInfo]):
    op = "health"
    result = HealthInfo


@dataclass
class Sync(Operation[Empty]):
    """Prepare for suspend or checkpoint: flush file data to the backing store."""

    op = "sync"
    result = Empty


@dataclass
class SetIdentity(Operation[IdentityInfo]):
    """Make a restored copy its own machine: clock, hostname, machine id, reseeded RNG."""

    op = "identity"
    result = IdentityInfo
    time: float | None = None
    hostname: str | None = None
    machine_id: str | None = None
    entropy: str | None = None  # base64 bytes mixed into the kernel RNG


# ---------------------------------------------------------------- commands and processes


@dataclass
class Exec(Operation[ExecResult]):
    """Run to completion. A known ``exec_id`` reattaches to that run instead of starting it again."""

    op = "exec"
    result = ExecResult
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    timeout: float | None = None
    max_output: int | None = None
    exec_id: str | None = None
    stdin: bool = False
    stdin_data: str | None = None  # base64; written to the command's stdin, then closed
    user: str | None = None  # "name", "uid", "name:group" or "uid:gid" in the sandbox; None: root


@dataclass
class ExecStatus(Operation[ExecResult]):
    op = "exec_status"
    result = ExecResult
    exec_id: str


@dataclass
class StartProcess(Operation[ProcessState]):
    op = "process_start"
    result = ProcessState
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    name: str | None = None
    stdin: bool = False
    id: str | None = None
    max_output: int | None = None  # bytes of each stream kept; default 8 MiB
    user: str | None = None  # as Exec's
    paced: bool = False  # streamed by a reader (ReadStreams): it waits for the reader rather than losing bytes


@dataclass
class ConnectPort(Operation[ProcessState]):
    """A connection to 127.0.0.1:PORT in the sandbox, as a process: its stdout is what the socket receives, its
    stdin (WriteStdin; close: a half-close) what it sends, SIGKILL closes it; the stdout is paced (StartProcess's).
    The daemon reaches a port of a sandbox without network this way, with nothing started in it."""

    op = "port_connect"
    result = ProcessState
    id: str
    port: int
    max_output: int | None = None


@dataclass
class ListProcesses(Operation[ProcessListing]):
    op = "process_list"
    result = ProcessListing


@dataclass
class GetProcess(Operation[ProcessState]):
    op = "process_get"
    result = ProcessState
    id: str


@dataclass
class ReadStreams(Operation[ProcessStreams]):
    """New output of both streams from their offsets, waiting up to ``wait`` s for either to move."""

    op = "process_read"
    result = ProcessStreams
    id: str
    stdout_offset: int = 0
    stderr_offset: int = 0
    max_bytes: int = 1 << 20
    wait: float = 0.0


@dataclass
class ReadOutput(Operation[OutputChunk]):
    """One stream from an absolute offset, waiting up to ``wait`` s for new bytes."""

    op = "process_output"
    result = OutputChunk
    id: str
    stream: str = "stdout"
    offset: int = 0
    max_bytes: int = 1 << 20
    wait: float = 0.0


@dataclass
class SignalProcess(Operation[ProcessState]):
    op = "process_signal"
    result = ProcessState
    id: str
    signal: str = "SIGTERM"
    tree: bool = True


@dataclass
class WriteStdin(Operation[Empty]):
    op = "process_stdin"
    result = Empty
    id: str
    data: str = ""
    close: bool = False


# ---------------------------------------------------------------- terminals


@dataclass
class OpenPty(Operation[ProcessState]):
    op = "pty_open"
    result = ProcessState
    cmd: list[str] | None = None
    cols: int = 80
    rows: int = 24
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    user: str | None = None  # as Exec's: its shell runs as this user, in their home unless cwd says


@dataclass
class WritePty(Operation[Empty]):
    op = "pty_write"
    result = Empty
    id: str
    data: str = ""


@dataclass
class ResizePty(Operation[PtySize]):
    op = "pty_resize"
    result = PtySize
    id: str
    cols: int = 80
    rows: int = 24


@dataclass
class ClosePty(Operation[ProcessState]):
    op = "pty_close"
    result = ProcessState
    id: str


OPERATIONS: dict[str, type[Operation[Any]]] = {
    op.op: op
    for op in (
        Health, Sync, SetIdentity, Exec, ExecStatus, StartProcess, ConnectPort, ListProcesses, GetProcess, ReadStreams,
        ReadOutput, SignalProcess, WriteStdin, OpenPty, WritePty, ResizePty, ClosePty, ReadFile, WriteFile,
        ListDir, StatFile, DeleteFile, MakeDir, ExtractTar, PackTar, ListFifos, PackChanges, StartWatch, ReadWatch,
        StopWatch,
    )
}  # fmt: skip
