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

# The protocol's vocabulary (re-exported: host and agent write P.ErrorKind, P.encode, ...)
from .wire import CANCEL_PREFIX, VERSION, ErrorKind, Operation, cancel_line, decode, encode  # noqa: F401

# ---------------------------------------------------------------- results


@dataclass
class Empty:
    pass


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


@dataclass
class FileData:
    data: str
    size: int
    eof: bool


@dataclass
class PathResult:
    path: str
    size: int | None = None


@dataclass
class FileStat:
    name: str
    path: str
    type: str  # "file" | "directory" | "symlink" | "other"
    size: int
    mode: int
    mtime: float
    owner: str = ""  # user and group names (the number when the guest has no name for it)
    group: str = ""
    target: str | None = None  # a symlink's target


@dataclass
class DirListing:
    path: str
    entries: list[FileStat] = field(default_factory=list, metadata={"of": FileStat})


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


# ---------------------------------------------------------------- files


@dataclass
class ReadFile(Operation[FileData]):
    op = "file_read"
    result = FileData
    path: str
    offset: int = 0
    length: int = 4 << 20


@dataclass
class WriteFile(Operation[PathResult]):
    """One chunk of an atomic write: chunks go to a temp file renamed over ``path`` by the ``final`` one."""

    op = "file_write"
    result = PathResult
    path: str
    data: str = ""
    offset: int = 0
    final: bool = True
    upload_id: str = "x"
    mode: int = 0o644
    make_parents: bool = True
    abort: bool = False  # the upload was cut off: remove its temp file now
    owner: str | None = None  # a user of the guest: the file (and parents it makes) become theirs


@dataclass
class ExtractTar(Operation[PathResult]):
    """Unpack the tar file ``archive`` (in the sandbox) as directory ``path``, which appears whole or not at
    all (``replace``: instead of what is there); the archive is removed."""

    op = "dir_extract"
    result = PathResult
    archive: str
    path: str
    replace: bool = False


@dataclass
class PackTar(Operation[PathResult]):
    """Pack directory ``path`` into the tar file ``archive`` (in the sandbox)."""

    op = "dir_pack"
    result = PathResult
    path: str
    archive: str


@dataclass
class ListDir(Operation[DirListing]):
    op = "file_list"
    result = DirListing
    path: str


@dataclass
class StatFile(Operation[FileStat]):
    op = "file_stat"
    result = FileStat
    path: str


@dataclass
class DeleteFile(Operation[Empty]):
    op = "file_delete"
    result = Empty
    path: str
    recursive: bool = False


@dataclass
class MakeDir(Operation[PathResult]):
    op = "mkdir"
    result = PathResult
    path: str
    exist_ok: bool = True
    owner: str | None = None  # as WriteFile's


@dataclass
class Fifo:
    path: str
    mode: int  # permission bits
    uid: int
    gid: int


@dataclass
class FifoList:
    fifos: list[Fifo] = field(default_factory=list, metadata={"of": Fifo})


@dataclass
class ListFifos(Operation[FifoList]):
    """Named pipes on the root file system, not below ``skip`` (gVisor keeps those a sandbox makes in its
    memory, never on the host: a FILESYSTEM checkpoint adds them from this list)."""

    op = "list_fifos"
    result = FifoList
    skip: list[str] = field(default_factory=list)


@dataclass
class PackChanges(Operation[PathResult]):
    """Pack into the tar file ``archive`` how the root file system differs from the image mounted read-only at
    ``image``, as an overlay's upper layer: what is new or changed, with every parent directory, and a whiteout
    (a character device 0:0) for each name the image has and the root no longer has. Nothing below ``skip``.
    (A sandbox whose writable layer lives in its kernel, gVisor's fast storage: the host cannot read it.)"""

    op = "pack_changes"
    result = PathResult
    image: str
    archive: str
    skip: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- watching directories


@dataclass
class WatchEvent:
    name: str  # the path below the watched directory
    type: str  # "create" | "write" | "remove" | "rename" | "chmod"


@dataclass
class WatchInfo:
    id: str


@dataclass
class WatchEvents:
    events: list[WatchEvent] = field(default_factory=list, metadata={"of": WatchEvent})
    lost: int = 0  # events dropped because nobody read them (the queue holds WATCH_QUEUE)
    closed: bool = False  # the watched directory is gone


@dataclass
class StartWatch(Operation[WatchInfo]):
    """Watch a directory (and, ``recursive``, those below it, made later ones too) with inotify."""

    op = "watch_start"
    result = WatchInfo
    path: str
    recursive: bool = False


@dataclass
class ReadWatch(Operation[WatchEvents]):
    """The events since the last read; waits up to ``wait`` seconds for one."""

    op = "watch_read"
    result = WatchEvents
    id: str
    wait: float = 0.0


@dataclass
class StopWatch(Operation[Empty]):
    op = "watch_stop"
    result = Empty
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
