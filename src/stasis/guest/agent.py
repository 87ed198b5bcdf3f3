"""The stasis guest agent: the one process that runs *inside* every sandbox.

Standard library only: it is copied into the sandbox and run by the image's own
``python3`` as the sandbox's init (pid 1). It speaks newline-delimited JSON on
stdin/stdout, which the host backs with FIFOs (gVisor) or a virtio-serial port
(microvm). Every request carries an ``id``; the reply carries the same id.

Wire format::

    -> {"id": "a1", "op": "exec", "args": {"cmd": ["echo", "hi"]}}
    <- {"id": "a1", "ok": true, "result": {"exit_code": 0, "stdout": "aGkK", ...}}
    <- {"id": "a2", "ok": false, "error": {"type": "FileNotFoundError", "message": "..."}}

Bytes travel base64-encoded. The agent never exits when the host goes away: the
host end of the byte stream is held open by the runtime, so a reply written
while nobody listens waits in the pipe for the next client. Commands keep
running while the host is away; their output is kept under their process id so
a returning client can collect it (``exec`` with a known ``exec_id`` reattaches
instead of running the command again).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, BinaryIO

VERSION = 1
DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "TERM": "xterm-256color",
}
EXEC_OUTPUT_LIMIT = 1 << 20  # default bytes of stdout (and of stderr) kept for an exec
PROCESS_OUTPUT_LIMIT = 8 << 20  # bytes of each stream kept for a background process
FINISHED_KEPT = 256  # finished processes remembered for reattachment
READ_CHUNK_LIMIT = 4 << 20
MARKER_ENV = "STASIS_EXEC_ID"
RNDADDENTROPY = 0x40085203  # _IOW('R', 0x03, int[2])
RNDRESEEDCRNG = 0x5207  # _IO('R', 0x07)


class RequestError(Exception):
    """An error the client caused; reported with ``type`` so the host can map it."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_


# ---------------------------------------------------------------- output


class OutputBuffer:
    """The last ``limit`` bytes of a stream, addressed by absolute offsets."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.start = 0  # absolute offset of data[0]
        self.closed = False

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


# ---------------------------------------------------------------- processes


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
        self.stdout = OutputBuffer(limit)
        self.stderr = OutputBuffer(limit)
        self.stdin: BinaryIO | None = None

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "name": self.name,
            "cmd": self.cmd,
            "status": "running" if self.exit_code is None else "exited",
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "stdout_bytes": self.stdout.end,
            "stderr_bytes": self.stderr.end,
        }


class ProcessTable:
    """Spawns, reaps and remembers processes.

    The agent is pid 1, so every orphan in the sandbox becomes its child. One
    thread reaps all children with ``waitpid(-1)`` and hands each exit status to
    the process that owns the pid; ``subprocess`` never waits on its own.
    """

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.by_id: dict[str, Process] = {}
        self.by_pid: dict[int, Process] = {}
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.early_exits: dict[int, int] = {}
        self.counter = 0
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
                if proc is None:
                    self.early_exits[pid] = code  # reaped before spawn() registered it, or an orphan
                    if len(self.early_exits) > 1024:
                        self.early_exits.pop(next(iter(self.early_exits)))
                else:
                    self._finish(proc, code)

    def _finish(self, proc: Process, code: int) -> None:
        proc.exit_code = code
        proc.finished_at = time.time()
        self.finished[proc.id] = None
        while len(self.finished) > FINISHED_KEPT:
            old, _ = self.finished.popitem(last=False)
            self.by_id.pop(old, None)
        self.lock.notify_all()

    def spawn(self, args: dict[str, Any], proc_id: str | None, limit: int) -> Process:
        cmd = args.get("cmd")
        if not isinstance(cmd, list) or not cmd or not all(isinstance(c, str) for c in cmd):
            raise RequestError("ValueError", "cmd must be a non-empty list of strings")
        env = dict(DEFAULT_ENV)
        env.update(args.get("env") or {})
        cwd = args.get("cwd") or env.get("HOME", "/")
        if not os.path.isdir(cwd):
            raise RequestError("ValueError", f"working directory {cwd!r} does not exist in the sandbox")
        with self.lock:
            self.counter += 1
            proc_id = proc_id or f"p-{self.counter}"
            if proc_id in self.by_id:
                raise RequestError("FileExistsError", f"a process with id {proc_id!r} already exists")
            env[MARKER_ENV] = proc_id
            try:
                popen = subprocess.Popen(
                    cmd,
                    stdin=subprocess.PIPE if args.get("stdin", False) else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise RequestError("CommandNotFound", f"command not found: {cmd[0]!r}") from exc
            except PermissionError as exc:
                raise RequestError("PermissionError", f"cannot execute {cmd[0]!r}: {exc.strerror}") from exc
            popen.returncode = 0  # we reap; stop Popen from ever calling waitpid itself
            proc = Process(popen.pid, proc_id, args.get("name"), cmd, limit)
            proc.stdin = popen.stdin
            self.by_id[proc_id] = proc
            if popen.pid in self.early_exits:
                self._finish(proc, self.early_exits.pop(popen.pid))
            else:
                self.by_pid[popen.pid] = proc
            self.lock.notify_all()  # wake the reaper if it idles for lack of children
        for stream, buffer in ((popen.stdout, proc.stdout), (popen.stderr, proc.stderr)):
            threading.Thread(target=self._pump, args=(stream, buffer), daemon=True).start()
        return proc

    def _pump(self, stream: BinaryIO, buffer: OutputBuffer) -> None:
        while True:
            chunk = os.read(stream.fileno(), 65536)
            with self.lock:
                if not chunk:
                    buffer.closed = True
                    self.lock.notify_all()
                    break
                buffer.append(chunk)
                self.lock.notify_all()
        stream.close()

    def get(self, proc_id: str) -> Process:
        with self.lock:
            proc = self.by_id.get(proc_id)
        if proc is None:
            raise RequestError("ProcessNotFound", f"no process with id {proc_id!r} in this sandbox")
        return proc

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
        for _ in range(50):
            victims = _tree_members(proc.pid, proc.id)
            if not victims:
                return
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            if sig != signal.SIGKILL:
                return
            time.sleep(0.02)


def _tree_members(root_pid: int, marker: str) -> set[int]:
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


# ---------------------------------------------------------------- the agent


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte. The runtime may hand us a non-blocking pipe: short writes and EAGAIN happen."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            select.select([], [fd], [], 0.05)


def read_lines(fd: int) -> Iterator[bytes]:
    """Lines from a byte stream that may be non-blocking and never ends."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            select.select([fd], [], [], 1.0)
            continue
        if not chunk:  # FIFOs: never (held open); a virtio-serial port: while no host is connected
            time.sleep(0.02)
            continue
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from lines


class Agent:
    def __init__(self, reader_fd: int, writer_fd: int) -> None:
        self.reader_fd = reader_fd
        self.writer_fd = writer_fd
        self.write_lock = threading.Lock()
        self.procs = ProcessTable()
        self.started_at = time.time()
        self.identity_written = threading.Event()  # commands see the new identity's files, never the old ones
        self.identity_written.set()

    # -- plumbing

    def serve(self) -> None:
        for line in read_lines(self.reader_fd):
            if line.strip():
                threading.Thread(target=self.handle, args=(line,), daemon=True).start()

    def handle(self, line: bytes) -> None:
        req_id: Any = None
        try:
            request = json.loads(line)
            req_id = request.get("id")
            method = getattr(self, "op_" + str(request.get("op")), None)
            if method is None:
                raise RequestError("UnknownOperation", f"unknown operation {request.get('op')!r}")
            if request.get("op") not in ("health", "identity"):
                self.identity_written.wait(10)
            reply = {"id": req_id, "ok": True, "result": method(request.get("args") or {})}
        except RequestError as exc:
            reply = {"id": req_id, "ok": False, "error": {"type": exc.type, "message": str(exc)}}
        except OSError as exc:
            message = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
            reply = {"id": req_id, "ok": False, "error": {"type": type(exc).__name__, "message": message}}
        except Exception as exc:  # an agent bug must not kill the sandbox's init
            traceback.print_exc(file=sys.stderr)
            reply = {"id": req_id, "ok": False, "error": {"type": "AgentError", "message": repr(exc)}}
        data = json.dumps(reply, separators=(",", ":")).encode() + b"\n"
        with self.write_lock:
            write_all(self.writer_fd, data)

    # -- health and lifecycle

    def op_health(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"version": VERSION, "pid": os.getpid(), "uptime": time.time() - self.started_at}

    def op_sync(self, args: dict[str, Any]) -> dict[str, Any]:
        """Prepare for suspend or checkpoint: flush file data to the backing store."""
        os.sync()
        return {}

    def op_identity(self, args: dict[str, Any]) -> dict[str, Any]:
        """Make a machine restored from a shared memory image its own: wall clock, hostname,
        machine id, and a kernel RNG reseeded with fresh host entropy (its state was copied too)."""
        if "time" in args:
            time.clock_settime(time.CLOCK_REALTIME, float(args["time"]))
        files = {}
        if args.get("hostname"):
            socket.sethostname(str(args["hostname"]))
            files["/etc/hostname"] = (str(args["hostname"]) + "\n").encode()
        if args.get("machine_id"):
            files["/etc/machine-id"] = (str(args["machine_id"]) + "\n").encode()
        if files:  # written (and fsynced) while the host goes on: this is on the path to a new sandbox's first exec
            self.identity_written.clear()
            threading.Thread(target=self._write_identity, args=(files,), daemon=True).start()
        if args.get("entropy"):
            seed = base64.b64decode(args["entropy"])
            with open("/dev/urandom", "wb") as rng:
                # struct rand_pool_info {int entropy_count; int buf_size; u32 buf[];}, credited in bits
                fcntl.ioctl(rng, RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
                fcntl.ioctl(rng, RNDRESEEDCRNG)
        return {"hostname": socket.gethostname(), "time": time.time()}

    def _write_identity(self, files: dict[str, bytes]) -> None:
        try:
            for path, data in files.items():
                try:
                    _write_atomic(path, data)
                except OSError as exc:
                    print(f"stasis agent: cannot write {path}: {exc}", file=sys.stderr)
        finally:
            self.identity_written.set()

    # -- commands

    def op_exec(self, args: dict[str, Any]) -> dict[str, Any]:
        """Run to completion. A known ``exec_id`` reattaches to that run instead of starting it again."""
        exec_id = args.get("exec_id")
        proc = None
        if exec_id:
            with self.procs.lock:
                proc = self.procs.by_id.get(exec_id)
        if proc is None:
            limit = int(args.get("max_output") or EXEC_OUTPUT_LIMIT)
            proc = self.procs.spawn(args, exec_id, limit)
            if "stdin_data" in args:
                self._feed_stdin(proc, _unb64(args["stdin_data"]))
        timeout = args.get("timeout")
        if not self.procs.wait(proc, timeout if timeout is None else float(timeout)):
            proc.timed_out = True
            self.procs.kill_tree(proc)
            self.procs.wait(proc, None)
        return self._exec_result(proc)

    def op_exec_status(self, args: dict[str, Any]) -> dict[str, Any]:
        """Look at a run by its exec id without waiting: running, or its full result."""
        proc = self.procs.get(str(args.get("exec_id")))
        if proc.exit_code is None:
            return {"exec_id": proc.id, "status": "running"}
        return self._exec_result(proc)

    def _exec_result(self, proc: Process) -> dict[str, Any]:
        with self.procs.lock:
            out, err = proc.stdout, proc.stderr
            return {
                "exec_id": proc.id,
                "status": "exited",
                "exit_code": proc.exit_code,
                "timed_out": proc.timed_out,
                "stdout": _b64(bytes(out.data)),
                "stderr": _b64(bytes(err.data)),
                "stdout_truncated": out.start > 0,
                "stderr_truncated": err.start > 0,
                "duration": (proc.finished_at or time.time()) - proc.started_at,
            }

    def _feed_stdin(self, proc: Process, data: bytes) -> None:
        stdin = proc.stdin
        if stdin is None:
            raise RequestError("ValueError", "process was started without stdin")

        def feed() -> None:
            try:
                stdin.write(data)
                stdin.close()
            except OSError:
                pass

        threading.Thread(target=feed, daemon=True).start()

    def op_process_start(self, args: dict[str, Any]) -> dict[str, Any]:
        proc = self.procs.spawn(args, args.get("id"), PROCESS_OUTPUT_LIMIT)
        return proc.info()

    def op_process_list(self, args: dict[str, Any]) -> dict[str, Any]:
        with self.procs.lock:
            return {"processes": [p.info() for p in self.procs.by_id.values()]}

    def op_process_get(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.procs.get(str(args.get("id"))).info()

    def op_process_wait(self, args: dict[str, Any]) -> dict[str, Any]:
        proc = self.procs.get(str(args.get("id")))
        timeout = args.get("timeout")
        self.procs.wait(proc, timeout if timeout is None else float(timeout))
        return proc.info()

    def op_process_read(self, args: dict[str, Any]) -> dict[str, Any]:
        """New output of both streams from their offsets, waiting up to ``wait`` s for either to move."""
        proc = self.procs.get(str(args.get("id")))
        offsets = {"stdout": int(args.get("stdout_offset", 0)), "stderr": int(args.get("stderr_offset", 0))}
        max_bytes = min(int(args.get("max_bytes", 1 << 20)), READ_CHUNK_LIMIT)
        deadline = time.monotonic() + float(args.get("wait", 0))

        def idle() -> bool:
            # Wait for new data or for both streams to close; one closed stream is no reason to return,
            # the other may still be draining what the process wrote before it exited.
            buffers = [(getattr(proc, name), offset) for name, offset in offsets.items()]
            no_data = all(buffer.end <= offset for buffer, offset in buffers)
            return no_data and not all(buffer.closed for buffer, _ in buffers)

        with self.procs.lock:
            while idle():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.procs.lock.wait(left)
            reply: dict[str, Any] = {"exit_code": proc.exit_code, "timed_out": proc.timed_out}
            for name, offset in offsets.items():
                buffer: OutputBuffer = getattr(proc, name)
                data, served_from, lost = buffer.read(offset, max_bytes)
                reply[name] = {
                    "data": _b64(data),
                    "offset": served_from,
                    "next_offset": served_from + len(data),
                    "lost": lost,
                    "eof": buffer.closed and served_from + len(data) >= buffer.end,
                }
            return reply

    # -- terminals

    def op_pty_open(self, args: dict[str, Any]) -> dict[str, Any]:
        """A command on a new pseudo-terminal; its screen output is kept like a process's stdout."""
        cols, rows = _window(args)
        master, slave = os.openpty()
        _set_window(master, cols, rows)
        env = dict(DEFAULT_ENV)
        env.update(args.get("env") or {})
        cmd = args.get("cmd") or ["/bin/bash", "-l"]
        with self.procs.lock:
            self.procs.counter += 1
            pty_id = f"t-{self.procs.counter}"
            env[MARKER_ENV] = pty_id
            try:
                pid = os.fork()
            except OSError:
                os.close(master)
                os.close(slave)
                raise
            if pid == 0:  # the child: a session leader whose controlling terminal is the pty
                try:
                    os.setsid()
                    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                    for fd in (0, 1, 2):
                        os.dup2(slave, fd)
                    os.closerange(3, 4096)
                    os.chdir(args.get("cwd") or env.get("HOME", "/"))
                    os.execvpe(cmd[0], cmd, env)
                finally:
                    os._exit(127)
            os.close(slave)
            proc = Process(pid, pty_id, args.get("name"), cmd, PROCESS_OUTPUT_LIMIT)
            proc.master = master  # type: ignore[attr-defined]
            proc.stderr.closed = True
            self.procs.by_id[pty_id] = proc
            if pid in self.procs.early_exits:
                self.procs._finish(proc, self.procs.early_exits.pop(pid))
            else:
                self.procs.by_pid[pid] = proc
            self.procs.lock.notify_all()
        threading.Thread(target=self._pump_pty, args=(proc, master), daemon=True).start()
        return proc.info()

    def _pump_pty(self, proc: Process, master: int) -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last user is gone
                chunk = b""
            with self.procs.lock:
                if not chunk:
                    proc.stdout.closed = True
                    self.procs.lock.notify_all()
                    break
                proc.stdout.append(chunk)
                self.procs.lock.notify_all()
        with contextlib.suppress(OSError):
            os.close(master)

    def _pty(self, args: dict[str, Any]) -> tuple[Process, int]:
        proc = self.procs.get(str(args.get("id")))
        master = getattr(proc, "master", None)
        if master is None:
            raise RequestError("ValueError", f"{proc.id!r} is a process, not a terminal")
        if proc.stdout.closed:
            raise RequestError("ProcessExited", f"terminal {proc.id!r} is closed")
        return proc, master

    def op_pty_write(self, args: dict[str, Any]) -> dict[str, Any]:
        _proc, master = self._pty(args)
        write_all(master, _unb64(args.get("data", "")))
        return {}

    def op_pty_resize(self, args: dict[str, Any]) -> dict[str, Any]:
        _proc, master = self._pty(args)
        cols, rows = _window(args)
        _set_window(master, cols, rows)
        return {"cols": cols, "rows": rows}

    def op_pty_close(self, args: dict[str, Any]) -> dict[str, Any]:
        proc = self.procs.get(str(args.get("id")))
        if proc.exit_code is None:
            # Hang up the terminal's session only: a tmux server it started lives on, detached.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
        return proc.info()

    def op_process_output(self, args: dict[str, Any]) -> dict[str, Any]:
        """Output of one stream from an absolute offset; waits up to ``wait`` seconds for new bytes."""
        proc = self.procs.get(str(args.get("id")))
        stream = args.get("stream", "stdout")
        if stream not in ("stdout", "stderr"):
            raise RequestError("ValueError", "stream must be 'stdout' or 'stderr'")
        buffer: OutputBuffer = getattr(proc, stream)
        offset = int(args.get("offset", 0))
        max_bytes = min(int(args.get("max_bytes", 1 << 20)), READ_CHUNK_LIMIT)
        deadline = time.monotonic() + float(args.get("wait", 0))
        with self.procs.lock:
            while buffer.end <= offset and not buffer.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.procs.lock.wait(left)
            data, served_from, lost = buffer.read(offset, max_bytes)
            return {
                "data": _b64(data),
                "offset": served_from,
                "next_offset": served_from + len(data),
                "lost": lost,
                "eof": buffer.closed and served_from + len(data) >= buffer.end,
                "exit_code": proc.exit_code,
            }

    def op_process_signal(self, args: dict[str, Any]) -> dict[str, Any]:
        proc = self.procs.get(str(args.get("id")))
        name = str(args.get("signal", "SIGTERM")).upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = getattr(signal.Signals, name, None) if name in signal.Signals.__members__ else None
        if sig is None:
            raise RequestError(
                "ValueError", f"unknown signal {args.get('signal')!r}; use e.g. SIGTERM, SIGINT, SIGKILL"
            )
        if proc.exit_code is not None:
            raise RequestError("ProcessExited", f"process {proc.id!r} already exited with code {proc.exit_code}")
        if args.get("tree", True):
            self.procs.kill_tree(proc, sig)
        else:
            os.kill(proc.pid, sig)
        return proc.info()

    def op_process_stdin(self, args: dict[str, Any]) -> dict[str, Any]:
        proc = self.procs.get(str(args.get("id")))
        if proc.stdin is None or proc.stdin.closed:
            raise RequestError("ValueError", f"process {proc.id!r} has no open stdin")
        if proc.exit_code is not None:
            raise RequestError("ProcessExited", f"process {proc.id!r} already exited; its stdin is gone")
        try:
            proc.stdin.write(_unb64(args.get("data", "")))
            proc.stdin.flush()
            if args.get("close"):
                proc.stdin.close()
        except BrokenPipeError as exc:
            raise RequestError("ProcessExited", f"process {proc.id!r} closed its stdin") from exc
        return {}

    # -- files

    def op_file_read(self, args: dict[str, Any]) -> dict[str, Any]:
        path = _abs(args)
        offset = int(args.get("offset", 0))
        length = min(int(args.get("length", READ_CHUNK_LIMIT)), READ_CHUNK_LIMIT)
        if os.path.isdir(path):
            raise RequestError("IsADirectoryError", f"{path} is a directory, not a file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(offset)
            data = f.read(length)
        return {"data": _b64(data), "size": size, "eof": offset + len(data) >= size}

    def op_file_write(self, args: dict[str, Any]) -> dict[str, Any]:
        """Chunked, atomic write: chunks go to a temp file renamed over ``path`` by the ``final`` chunk."""
        path = _abs(args)
        if os.path.isdir(path):
            raise RequestError("IsADirectoryError", f"{path} is a directory, not a file")
        parent = os.path.dirname(path)
        if args.get("make_parents", True):
            os.makedirs(parent, exist_ok=True)
        upload = str(args.get("upload_id", "x"))
        if not upload.isalnum():
            raise RequestError("ValueError", "upload_id must be alphanumeric")
        temp = os.path.join(parent, f".{os.path.basename(path)}.stasis-{upload}")
        offset = int(args.get("offset", 0))
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if offset == 0 else 0)
        fd = os.open(temp, flags, 0o600)
        try:
            os.pwrite(fd, _unb64(args.get("data", "")), offset)
            if args.get("final", True):
                os.fchmod(fd, int(args.get("mode", 0o644)))
                os.fsync(fd)
        finally:
            os.close(fd)
        if args.get("final", True):
            os.replace(temp, path)
            _fsync_dir(parent)  # in a VM, a rename not yet in the journal dies with the guest
            return {"path": path, "size": os.stat(path).st_size}
        return {"path": path}

    def op_file_list(self, args: dict[str, Any]) -> dict[str, Any]:
        path = _abs(args)
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise RequestError("NotADirectoryError", f"{path} is not a directory")
            raise RequestError("FileNotFoundError", f"no such directory: {path}")
        entries = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    entries.append(_stat_dict(entry.path, entry.name))
                except FileNotFoundError:
                    continue
        entries.sort(key=lambda e: e["name"])
        return {"path": path, "entries": entries}

    def op_file_stat(self, args: dict[str, Any]) -> dict[str, Any]:
        path = _abs(args)
        return _stat_dict(path, os.path.basename(path) or "/")

    def op_file_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        path = _abs(args)
        if os.path.isdir(path) and not os.path.islink(path):
            if args.get("recursive"):
                shutil.rmtree(path)
            else:
                os.rmdir(path)
        else:
            os.unlink(path)
        return {}

    def op_mkdir(self, args: dict[str, Any]) -> dict[str, Any]:
        path = _abs(args)
        os.makedirs(path, exist_ok=bool(args.get("exist_ok", True)))
        return {"path": path}


def _window(args: dict[str, Any]) -> tuple[int, int]:
    cols, rows = args.get("cols", 80), args.get("rows", 24)
    if not (isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= 1000 and 1 <= rows <= 1000):
        raise RequestError("ValueError", f"terminal size {cols}x{rows} is invalid; columns and rows must be 1-1000")
    return cols, rows


def _set_window(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _abs(args: dict[str, Any]) -> str:
    path = args.get("path")
    if not isinstance(path, str) or not path or "\0" in path:
        raise RequestError("ValueError", "path must be a non-empty string without NUL bytes")
    return os.path.normpath(os.path.join("/root", path))


def _stat_dict(path: str, name: str) -> dict[str, Any]:
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "name": name,
        "path": path,
        "type": kind,
        "size": st.st_size,
        "mode": stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
    }


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    temp = f"{path}.stasis-tmp"
    with open(temp, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), 0o444 if path == "/etc/machine-id" else 0o644)
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync_dir(os.path.dirname(path))


def main() -> None:
    # Inherited descriptors above stdio would be captured by a checkpoint; drop them.
    os.closerange(3, 4096)
    # pid 1 stays up until the runtime stops the sandbox. A handler, not SIG_IGN: an ignored signal
    # would be inherited by every command, and `kill -TERM` or Ctrl-C would stop working in them.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    os.chdir("/")
    Agent(sys.stdin.fileno(), sys.stdout.fileno()).serve()


if __name__ == "__main__":
    main()
