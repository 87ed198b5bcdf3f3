"""The agent's command operations: run to completion, background processes and their output.

Runs inside the sandbox (standard library only). Every command keeps its output under
its id, so a client that went away (killed, or the sandbox was suspended) can come back
and collect it: ``exec`` with a known ``exec_id`` reattaches instead of running again.
"""

from __future__ import annotations

import base64
import os
import signal
import time

from . import protocol as P
from .processes import (
    EXEC_OUTPUT_LIMIT,
    PROCESS_OUTPUT_LIMIT,
    OutputBuffer,
    Process,
    ProcessTable,
    RequestError,
    start_thread,
)

READ_CHUNK_LIMIT = 4 << 20
EXIT_GRACE = 0.2  # seconds a read of an exited process waits for streams a daemonised child keeps open


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError as exc:
        raise RequestError(P.ErrorKind.INVALID, f"data is not valid base64: {exc}") from exc


def chunk(buffer: OutputBuffer, offset: int, max_bytes: int) -> P.StreamChunk:
    data, served_from, lost = buffer.read(offset, min(max_bytes, READ_CHUNK_LIMIT))
    return P.StreamChunk(
        data=b64(data),
        offset=served_from,
        next_offset=served_from + len(data),
        lost=lost,
        eof=buffer.closed and served_from + len(data) >= buffer.end,
    )


class Commands:
    def __init__(self, procs: ProcessTable) -> None:
        self.procs = procs

    def exec(self, req: P.Exec) -> P.ExecResult:
        proc = self.procs.find(req.exec_id)
        if proc is None:
            proc = self.procs.spawn(
                req.cmd,
                req.env,
                req.cwd,
                req.exec_id,
                int(req.max_output or EXEC_OUTPUT_LIMIT),
                stdin=req.stdin,
                user=req.user,
            )
            if req.stdin_data is not None:
                self._feed_stdin(proc, unb64(req.stdin_data))
        timeout = None if req.timeout is None else float(req.timeout)
        if not self.procs.wait(proc, timeout):
            proc.timed_out = True
            self.procs.kill_tree(proc)
            self.procs.wait(proc, None)
        return self._result(proc)

    def exec_status(self, req: P.ExecStatus) -> P.ExecResult:
        """A run by its exec id, without waiting: running, or its full result."""
        proc = self.procs.get(str(req.exec_id))
        if proc.exit_code is None:
            return P.ExecResult(exec_id=proc.id, status="running")
        return self._result(proc)

    def _result(self, proc: Process) -> P.ExecResult:
        with self.procs.lock:
            out, err = proc.stdout, proc.stderr
            return P.ExecResult(
                exec_id=proc.id,
                status="exited",
                exit_code=proc.exit_code,
                timed_out=proc.timed_out,
                stdout=b64(bytes(out.data)),
                stderr=b64(bytes(err.data)),
                stdout_truncated=out.start > 0,
                stderr_truncated=err.start > 0,
                duration=(proc.finished_at or time.time()) - proc.started_at,
                limit=proc.limit,
            )

    def _feed_stdin(self, proc: Process, data: bytes) -> None:
        stdin = proc.stdin
        if stdin is None:
            raise RequestError(P.ErrorKind.INVALID, "process was started without stdin")

        def feed() -> None:
            try:
                stdin.write(data)
                stdin.close()
            except OSError:
                pass

        start_thread(feed)

    # -- background processes

    def start(self, req: P.StartProcess) -> P.ProcessState:
        limit = int(req.max_output or PROCESS_OUTPUT_LIMIT)
        proc = self.procs.spawn(req.cmd, req.env, req.cwd, req.id, limit, name=req.name, stdin=req.stdin, user=req.user)
        if req.paced:
            with self.procs.lock:
                proc.stdout.paced = proc.stderr.paced = True
        return proc.state()

    def connect(self, req: P.ConnectPort) -> P.ProcessState:
        return self.procs.connect(int(req.port), str(req.id), int(req.max_output or PROCESS_OUTPUT_LIMIT)).state()

    def list(self, req: P.ListProcesses) -> P.ProcessListing:
        return P.ProcessListing(processes=self.procs.states())

    def get(self, req: P.GetProcess) -> P.ProcessState:
        return self.procs.get(str(req.id)).state()

    def read_streams(self, req: P.ReadStreams) -> P.ProcessStreams:
        proc = self.procs.get(str(req.id))
        offsets = {"stdout": int(req.stdout_offset), "stderr": int(req.stderr_offset)}
        deadline = time.monotonic() + float(req.wait)
        with self.procs.lock:  # what the reader has had: a paced writer may go on
            for name, offset in offsets.items():
                buffer: OutputBuffer = getattr(proc, name)
                buffer.acked, buffer.last_read = max(buffer.acked, offset), time.monotonic()
            self.procs.lock.notify_all()

        def idle() -> bool:
            # Wait for new data, or for the end: both streams closed and the process reaped (one closed stream
            # is no reason to return, the other may still be draining what the process wrote before it
            # exited). A process that exited while its streams stay open (a daemonised child holds them) ends
            # the wait EXIT_GRACE after its exit.
            buffers = [(getattr(proc, name), offset) for name, offset in offsets.items()]
            if any(buffer.end > offset for buffer, offset in buffers):
                return False
            if all(buffer.closed for buffer, _ in buffers):
                return proc.exit_code is None
            return proc.finished_at is None or time.time() - proc.finished_at < EXIT_GRACE

        with self.procs.lock:
            while idle():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.procs.lock.wait(left if proc.exit_code is None else min(left, EXIT_GRACE))
            return P.ProcessStreams(
                exit_code=proc.exit_code,
                timed_out=proc.timed_out,
                stdout=chunk(proc.stdout, offsets["stdout"], int(req.max_bytes)),
                stderr=chunk(proc.stderr, offsets["stderr"], int(req.max_bytes)),
                limit=proc.limit,
            )

    def read_output(self, req: P.ReadOutput) -> P.OutputChunk:
        proc = self.procs.get(str(req.id))
        if req.stream not in ("stdout", "stderr"):
            raise RequestError(P.ErrorKind.INVALID, "stream must be 'stdout' or 'stderr'")
        buffer: OutputBuffer = getattr(proc, req.stream)
        offset = int(req.offset)
        deadline = time.monotonic() + float(req.wait)
        with self.procs.lock:
            while buffer.end <= offset and not buffer.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.procs.lock.wait(left)
            part = chunk(buffer, offset, int(req.max_bytes))
            return P.OutputChunk(part.data, part.offset, part.next_offset, part.lost, part.eof, proc.exit_code)

    def signal(self, req: P.SignalProcess) -> P.ProcessState:
        proc = self.procs.get(str(req.id))
        name = str(req.signal).upper()
        if not name.startswith("SIG"):
            name = "SIG" + name
        sig = signal.Signals[name] if name in signal.Signals.__members__ else None
        if sig is None:
            raise RequestError(P.ErrorKind.INVALID, f"unknown signal {req.signal!r}; use e.g. SIGTERM, SIGINT, SIGKILL")
        if proc.exit_code is not None:
            raise RequestError(
                P.ErrorKind.PROCESS_EXITED, f"process {proc.id!r} already exited with code {proc.exit_code}"
            )
        if req.tree or proc.socket is not None:
            self.procs.kill_tree(proc, sig)
        else:
            os.kill(proc.pid, sig)
        return proc.state()

    def write_stdin(self, req: P.WriteStdin) -> P.Empty:
        proc = self.procs.get(str(req.id))
        if proc.stdin is None or proc.stdin.closed:
            raise RequestError(P.ErrorKind.INVALID, f"process {proc.id!r} has no open stdin")
        if proc.exit_code is not None:
            raise RequestError(P.ErrorKind.PROCESS_EXITED, f"process {proc.id!r} already exited; its stdin is gone")
        try:
            proc.stdin.write(unb64(req.data))
            proc.stdin.flush()
            if req.close:
                proc.stdin.close()
        except BrokenPipeError as exc:
            raise RequestError(P.ErrorKind.PROCESS_EXITED, f"process {proc.id!r} closed its stdin") from exc
        return P.Empty()
