"""The agent's process table: spawning, reaping and remembering commands and their output.

Runs inside the sandbox (standard library only). The agent is pid 1, so every orphan
in the sandbox becomes its child: one thread reaps all children with ``waitpid(-1)``
and hands each exit status to the process that owns the pid.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, BinaryIO

from . import protocol as P
from .fence import Fence
from .workers import WORKERS

DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "xterm-256color",
}
EXEC_OUTPUT_LIMIT = 1 << 20  # default bytes of stdout (and of stderr) kept for an exec
PROCESS_OUTPUT_LIMIT = 8 << 20  # bytes of each stream kept for a background process
FINISHED_KEPT = 256  # finished processes remembered for reattachment
MARKER_ENV = "STASIS_EXEC_ID"


class RequestError(Exception):
    """An error the client caused; reported with its ``kind`` (a :class:`protocol.ErrorKind`)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def start_thread(target: Any, *args: Any) -> None:
    """A thread (reused: see :mod:`.workers`); a sandbox out of threads (a fork bomb) gets an error, not a
    dead agent."""
    try:
        WORKERS.submit(target, *args)
    except RuntimeError as exc:  # "can't start new thread"
        raise RequestError(P.ErrorKind.OS_ERROR, f"the sandbox is out of threads or processes: {exc}") from exc


def write_all(fd: int, data: bytes) -> None:
    """Write every byte. The runtime may hand us a non-blocking pipe: short writes and EAGAIN happen."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 0.05)


PACE_TIMEOUT = 60.0  # seconds a paced stream waits for its reader before it drops the oldest bytes again


class OutputBuffer:
    """The last ``limit`` bytes of a stream, addressed by absolute offsets."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.start = 0  # absolute offset of data[0]
        self.closed = False
        # Paced: a reader streams it, and the writer waits for the reader instead of losing the oldest bytes
        # (the command blocks on its pipe, as under `ssh`). A reader silent for PACE_TIMEOUT unpaces it.
        self.paced = False
        self.acked = 0  # the reader has had everything before this offset
        self.last_read = time.monotonic()

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    def append(self, chunk: bytes) -> None:
        self.data += chunk
        overflow = len(self.data) - self.limit
        if overflow > 0:
            del self.data[:overflow]
            self.start += overflow

    def read(self, offset: int, max_bytes: int) -> tuple[bytes, int, int]:
        """Bytes from ``offset``; returns (data, first offset served, bytes lost before it)."""
        offset = max(0, offset)
        lost = max(0, self.start - offset)
        begin = max(offset, self.start) - self.start
        return bytes(self.data[begin : begin + max_bytes]), max(offset, self.start), lost


class Process:
    def __init__(self, pid: int, proc_id: str, name: str | None, cmd: list[str], limit: int) -> None:
        self.pid = pid
        self.id = proc_id
        self.name = name
        self.cmd = cmd
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.exit_code: int | None = None
        self.timed_out = False
        self.cgroup: str | None = None  # its own cgroup (microVM), killed as a whole
        self.limits_before: tuple[int, int] | None = None
        self.limit: str | None = None  # a sandbox limit it ran into (processes, memory), said for a user
        self.stdout = OutputBuffer(limit)
        self.stderr = OutputBuffer(limit)
        self.stdin: Any = None  # a pipe (BinaryIO), or a connection's sending side (sockets.SocketInput)
        self.master: int | None = None  # a terminal's pty master
        self.socket: Any = None  # a port's connection (ConnectPort, a socket): no process behind it

    def state(self) -> P.ProcessState:
        return P.ProcessState(
            id=self.id,
            pid=self.pid,
            name=self.name,
            cmd=self.cmd,
            status="running" if self.exit_code is None else "exited",
            exit_code=self.exit_code,
            started_at=self.started_at,
            finished_at=self.finished_at,
            stdout_bytes=self.stdout.end,
            stderr_bytes=self.stderr.end,
            limit=self.limit,
        )


def resolve_user(spec: str) -> tuple[int, int, str]:
    """(uid, gid, home) of "name", "uid", "name:group" or "uid:gid" in this sandbox's own passwd."""
    import grp
    import pwd

    name, _, group = spec.partition(":")
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, home = entry.pw_uid, entry.pw_gid, entry.pw_dir
    except KeyError:
        if not name.isdigit():
            raise RequestError(P.ErrorKind.INVALID, f"no user {name!r} in the sandbox's /etc/passwd") from None
        uid, gid, home = int(name), int(name), "/"
    if group:
        try:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError:
            raise RequestError(P.ErrorKind.INVALID, f"no group {group!r} in the sandbox's /etc/group") from None
    return uid, gid, home


def child_setup(group: str | None, identity: tuple[int, int, str] | None) -> Callable[[], None] | None:
    """What a forked child does before exec: join its cgroup (as root), then drop to its user."""
    if group is None and identity is None:
        return None

    def setup() -> None:
        if group is not None:
            Fence.join(group)
        if identity is not None:
            os.setgroups([])
            os.setgid(identity[1])
            os.setuid(identity[0])

    return setup


def command_env(extra: dict[str, str] | None, marker: str) -> dict[str, str]:
    env = dict(DEFAULT_ENV)
    env.update(extra or {})
    env[MARKER_ENV] = marker
    return env


class ProcessTable:
    def __init__(self, fence: Fence | None = None) -> None:
        self.fence = fence  # the cgroup commands start in (microVM); None: the host fences the sandbox
        self.lock = threading.Condition()
        self.by_id: dict[str, Process] = {}
        self.by_pid: dict[int, Process] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.early_exits: dict[int, int] = {}
        self.others: dict[int, int | None] = {}  # children started outside the table (sudo's): pid -> exit code
        self.counter = 0

    def start_reaping(self) -> None:
        """Reap every child of this process from now on. Only the agent's own process may: a
        ``waitpid(-1)`` thread elsewhere (a test importing the agent) steals its host's exits."""
        threading.Thread(target=self._reap_forever, name="reaper", daemon=True).start()

    def _reap_forever(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                with self.lock:
                    self.lock.wait(0.5)
                continue
            code = os.waitstatus_to_exitcode(status)
            with self.lock:
                proc = self.by_pid.pop(pid, None)
                if proc is None and pid in self.others:
                    self.others[pid] = code
                    self.lock.notify_all()
                elif proc is None:
                    self.early_exits[pid] = code  # reaped before spawn() registered it, or an orphan
                    if len(self.early_exits) > 1024:
                        self.early_exits.pop(next(iter(self.early_exits)))
                else:
                    self._finish(proc, code)

    def mark_limits(self, proc: Process, group: str | None) -> None:
        if self.fence is not None:
            proc.cgroup = group
            proc.limits_before = self.fence.counters()

    def _finish(self, proc: Process, code: int) -> None:
        proc.exit_code = code
        proc.finished_at = time.time()
        if self.fence is not None and proc.limits_before is not None:
            proc.limit = self.fence.exceeded_since(proc.limits_before)
        if self.fence is not None and proc.cgroup:
            self.fence.release(proc.cgroup)
        self.finished[proc.id] = None
        while len(self.finished) > FINISHED_KEPT:
            old, _ = self.finished.popitem(last=False)
            self.by_id.pop(old, None)
        self.lock.notify_all()

    def start_other(self, start: Callable[[], subprocess.Popen[bytes]]) -> int:
        """A child started by ``start`` outside the table (not listed as a process): its pid, to wait for."""
        with self.lock:  # held until it is known: the reaper records its exit only after
            popen = start()
            popen.returncode = 0  # we reap; stop Popen from ever calling waitpid itself
            self.others[popen.pid] = None
            self.lock.notify_all()  # wake the reaper if it idles for lack of children
            return popen.pid

    def wait_other(self, pid: int) -> int:
        with self.lock:
            while (code := self.others.get(pid)) is None:
                self.lock.wait()
            del self.others[pid]
            return code

    def next_id(self, prefix: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{prefix}-{self.counter}"

    def register(self, proc: Process) -> None:
        """Track a process just forked (call with the lock held, before its exit can be missed)."""
        self.by_id[proc.id] = proc
        if proc.pid in self.early_exits:
            self._finish(proc, self.early_exits.pop(proc.pid))
        else:
            self.by_pid[proc.pid] = proc
        self.lock.notify_all()  # wake the reaper if it idles for lack of children

    def spawn(
        self,
        cmd: list[str],
        env: dict[str, str] | None,
        cwd: str | None,
        proc_id: str | None,
        limit: int,
        *,
        name: str | None = None,
        stdin: bool = False,
        user: str | None = None,
    ) -> Process:
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise RequestError(P.ErrorKind.INVALID, "cmd must be a non-empty list of strings")
        identity = resolve_user(user) if user else None
        with self.lock:
            proc_id = proc_id or self.next_id("p")
            if proc_id in self.by_id:
                raise RequestError(P.ErrorKind.FILE_EXISTS, f"a process with id {proc_id!r} already exists")
            full_env = command_env(env, proc_id)
            if identity is not None and "HOME" not in (env or {}):
                full_env["HOME"] = identity[2]
            cwd = cwd or full_env.get("HOME", "/")
            if not os.path.isdir(cwd):
                raise RequestError(P.ErrorKind.NO_WORKDIR, f"working directory {cwd!r} does not exist in the sandbox")
            group = self.fence.new_group() if self.fence else None
            try:
                popen = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=full_env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=child_setup(group, identity),
                )
            except FileNotFoundError as exc:
                raise RequestError(P.ErrorKind.COMMAND_NOT_FOUND, f"command not found: {cmd[0]!r}") from exc
            except PermissionError as exc:
                raise RequestError(P.ErrorKind.PERMISSION, f"cannot execute {cmd[0]!r}: {exc.strerror}") from exc
            except (BlockingIOError, RuntimeError) as exc:  # EAGAIN from fork: out of processes
                raise RequestError(P.ErrorKind.OS_ERROR, f"cannot start {cmd[0]!r}: {exc}") from exc
            except BaseException:
                if group and self.fence:
                    self.fence.release(group)
                raise
            popen.returncode = 0  # we reap; stop Popen from ever calling waitpid itself
            proc = Process(popen.pid, proc_id, name, cmd, limit)
            proc.stdin = popen.stdin
            self.mark_limits(proc, group)
            self.register(proc)
        for stream, buffer in ((popen.stdout, proc.stdout), (popen.stderr, proc.stderr)):
            start_thread(self._pump, stream.fileno(), buffer, stream)
        return proc

    def connect(self, port: int, proc_id: str, limit: int) -> Process:
        """127.0.0.1:PORT as a process entry (see P.ConnectPort and ``sockets``)."""
        from .sockets import connect

        return connect(self, port, proc_id, limit)

    def add_connection(self, proc: Process) -> None:
        with self.lock:
            if proc.id in self.by_id:
                raise RequestError(P.ErrorKind.FILE_EXISTS, f"a process with id {proc.id!r} already exists")
            self.by_id[proc.id] = proc

    def end_connection(self, proc: Process) -> None:
        with self.lock:
            self._finish(proc, 0)

    def pump(self, fd: int, buffer: OutputBuffer) -> None:
        """Copy a stream into its buffer until it ends (EIO from a pty counts as the end)."""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            with self.lock:
                if not chunk:
                    buffer.closed = True
                    self.lock.notify_all()
                    return
                while buffer.paced and buffer.end + len(chunk) - buffer.acked > buffer.limit:
                    if time.monotonic() - buffer.last_read > PACE_TIMEOUT:
                        buffer.paced = False  # its reader went away: keep the newest bytes, as unpaced
                        break
                    self.lock.wait(1.0)
                buffer.append(chunk)
                self.lock.notify_all()

    def _pump(self, fd: int, buffer: OutputBuffer, stream: BinaryIO) -> None:
        try:
            self.pump(fd, buffer)
        finally:
            stream.close()

    def get(self, proc_id: str) -> Process:
        with self.lock:
            proc = self.by_id.get(proc_id)
        if proc is None:
            raise RequestError(P.ErrorKind.PROCESS_NOT_FOUND, f"no process with id {proc_id!r} in this sandbox")
        return proc

    def find(self, proc_id: str | None) -> Process | None:
        with self.lock:
            return self.by_id.get(proc_id) if proc_id else None

    def states(self) -> list[P.ProcessState]:
        with self.lock:
            return [p.state() for p in self.by_id.values()]

    def wait(self, proc: Process, timeout: float | None) -> bool:
        """Wait for exit, then briefly for the output pipes to drain. True if it exited."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.lock:
            while proc.exit_code is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.lock.wait(left)
            # A background grandchild may hold the pipes open forever: don't wait for it.
            drain_until = time.monotonic() + 0.2
            while not (proc.stdout.closed and proc.stderr.closed):
                left = drain_until - time.monotonic()
                if left <= 0:
                    break
                self.lock.wait(left)
        return True

    def kill_tree(self, proc: Process, sig: int = signal.SIGKILL) -> None:
        """Signal the process, its group, its descendants and everything carrying its marker."""
        if proc.socket is not None:  # a connection: any signal ends it (there is no pid to signal)
            with contextlib.suppress(OSError):
                proc.socket.shutdown(socket.SHUT_RDWR)
            return
        if sig == signal.SIGKILL and self.fence is not None and proc.cgroup:
            self.fence.kill(proc.cgroup)
        for _ in range(50):
            victims = tree_members(proc.pid, proc.id)
            if not victims:
                return
            # The process itself first: were a child killed before it, it would exit on its own (137, not -9).
            for pid in sorted(victims, key=lambda p: p != proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig != signal.SIGKILL:
                return
            time.sleep(0.02)


def tree_members(root_pid: int, marker: str) -> set[int]:
    """Live pids that belong to a process: descendants, its session, or its env marker."""
    needle = f"{MARKER_ENV}={marker}".encode()
    parents: dict[int, int] = {}
    members: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == 1:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == b"Z":
            continue
        parents[pid] = int(fields[1])
        if pid == root_pid or int(fields[3]) == root_pid:  # fields[3]: session id
            members.add(pid)
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    members.add(pid)
        except OSError:
            pass
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                changed = True
    return members
