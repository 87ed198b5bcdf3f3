"""The agent's pseudo-terminals: a program on a pty whose screen output is kept like stdout.

Runs inside the sandbox (standard library only).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct

from . import protocol as P
from .commands import unb64
from .fence import Fence
from .processes import (
    PROCESS_OUTPUT_LIMIT,
    Process,
    ProcessTable,
    RequestError,
    command_env,
    resolve_user,
    start_thread,
    write_all,
)


def _window(cols: int, rows: int) -> tuple[int, int]:
    if not (isinstance(cols, int) and isinstance(rows, int) and 1 <= cols <= 1000 and 1 <= rows <= 1000):
        raise RequestError(
            P.ErrorKind.INVALID, f"terminal size {cols}x{rows} is invalid; columns and rows must be 1-1000"
        )
    return cols, rows


def _set_window(fd: int, cols: int, rows: int) -> None:
    import termios  # here, not at the top: the agent's boot does not pay for it

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Terminals:
    def __init__(self, procs: ProcessTable) -> None:
        self.procs = procs

    def open(self, req: P.OpenPty) -> P.ProcessState:
        import termios  # imported before the fork: never import in a forked child (the import lock)

        cols, rows = _window(req.cols, req.rows)
        cmd = req.cmd or ["/bin/bash", "-l"]
        identity = resolve_user(str(req.user)) if req.user else None
        master, slave = os.openpty()
        _set_window(master, cols, rows)
        with self.procs.lock:
            pty_id = self.procs.next_id("t")
            env = command_env(req.env, pty_id)
            if identity is not None:
                name = str(req.user).partition(":")[0]
                for key, value in (("HOME", identity[2]), ("USER", name), ("LOGNAME", name)):
                    if key not in req.env:  # the caller's own values win
                        env[key] = value
            group = self.procs.fence.new_group() if self.procs.fence else None
            try:
                pid = os.fork()
            except OSError:
                os.close(master)
                os.close(slave)
                if group and self.procs.fence:
                    self.procs.fence.release(group)
                raise
            if pid == 0:  # the child: a session leader whose controlling terminal is the pty
                try:
                    if group:
                        Fence.join(group)
                    os.setsid()
                    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
                    for fd in (0, 1, 2):
                        os.dup2(slave, fd)
                    os.closerange(3, 4096)
                    if identity is not None:
                        os.setgroups([])
                        os.setgid(identity[1])
                        os.setuid(identity[0])
                    os.chdir(req.cwd or env.get("HOME", "/"))
                    os.execvpe(cmd[0], cmd, env)
                finally:
                    os._exit(127)
            os.close(slave)
            proc = Process(pid, pty_id, None, cmd, PROCESS_OUTPUT_LIMIT)
            proc.master = master
            self.procs.mark_limits(proc, group)
            proc.stderr.closed = True
            self.procs.register(proc)
        start_thread(self._pump, proc, master)
        return proc.state()

    def _pump(self, proc: Process, master: int) -> None:
        try:
            self.procs.pump(master, proc.stdout)
        finally:
            with contextlib.suppress(OSError):
                os.close(master)

    def _pty(self, pty_id: str) -> tuple[Process, int]:
        proc = self.procs.get(str(pty_id))
        if proc.master is None:
            raise RequestError(P.ErrorKind.INVALID, f"{proc.id!r} is a process, not a terminal")
        if proc.stdout.closed:
            raise RequestError(P.ErrorKind.PROCESS_EXITED, f"terminal {proc.id!r} is closed")
        return proc, proc.master

    def write(self, req: P.WritePty) -> P.Empty:
        _proc, master = self._pty(req.id)
        write_all(master, unb64(req.data))
        return P.Empty()

    def resize(self, req: P.ResizePty) -> P.PtySize:
        _proc, master = self._pty(req.id)
        cols, rows = _window(req.cols, req.rows)
        _set_window(master, cols, rows)
        return P.PtySize(cols=cols, rows=rows)

    def close(self, req: P.ClosePty) -> P.ProcessState:
        proc = self.procs.get(str(req.id))
        if proc.exit_code is None:
            # Hang up the terminal's session only: a tmux server it started lives on, detached.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
        return proc.state()
