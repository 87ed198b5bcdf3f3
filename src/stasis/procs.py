"""Running host commands (runsc, qemu-img, ...) from the daemon, and reaping what they leave.

``runsc run -detach`` forks a sandbox and exits; the orphaned sandbox is
re-parented to the nearest *subreaper*. If that is the host's init, it may reap
slowly (here: 1-2 s), and ``runsc delete`` waits for it. So the process that
drives runsc makes itself a child subreaper and reaps every child in one thread,
handing each exit status to whoever started that pid. A child it does not know
(started with ``subprocess`` elsewhere in the process) is left to its owner for
a moment first, so ``subprocess.run`` still reads its real exit status.

asyncio subprocesses cannot coexist with it: use :func:`run` and :func:`spawn`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
ORPHAN_GRACE = 0.25  # seconds an unregistered child's exit is left to whoever started it


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def output(self) -> str:
        return (self.stderr or self.stdout).decode(errors="replace").strip()


class _Reaper:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        # pid -> who waits: an event loop's future, or (a blocking caller) a concurrent future
        self._waiters: dict[int, tuple[asyncio.AbstractEventLoop | None, Any]] = {}
        self._started = False

    def _start(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("could not become a child subreaper (errno %d)", ctypes.get_errno())
        threading.Thread(target=self._reap_forever, name="child-reaper", daemon=True).start()
        self._started = True

    def _reap_forever(self) -> None:
        while True:
            try:
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)  # look, do not reap yet
            except ChildProcessError:
                with self._lock:
                    self._lock.wait(1.0)
                continue
            if exited is None:
                continue
            pid = exited.si_pid
            with self._lock:
                waiter = self._waiters.pop(pid, None)
            if waiter is None and self._reaped_by_its_owner(pid):
                continue
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                continue
            if waiter is not None:
                self._hand_over(waiter, os.waitstatus_to_exitcode(status))

    @staticmethod
    def _hand_over(waiter: tuple[asyncio.AbstractEventLoop | None, Any], code: int) -> None:
        loop, future = waiter
        if loop is None:
            future.set_result(code)
            return
        try:
            loop.call_soon_threadsafe(_resolve, future, code)
        except RuntimeError:  # its event loop closed (asyncio.run ended): nobody waits; the reaper must live on
            log.debug("exit %d of a child whose event loop is gone", code)

    @staticmethod
    def _reaped_by_its_owner(pid: int) -> bool:
        """An exited child nobody registered: an orphan re-parented to us (reap it), or a child that
        other code started with subprocess and is about to wait for (leave it its exit status)."""
        deadline = time.monotonic() + ORPHAN_GRACE
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                    return True  # no longer waitable as this pid's zombie: waited for elsewhere
            except ChildProcessError:
                return True
            time.sleep(0.01)
        return False

    def _popen(self, argv: Sequence[str], waiter: tuple[asyncio.AbstractEventLoop | None, Any] | None,
               **popen_kwargs: Any) -> subprocess.Popen:  # fmt: skip
        """Start a process; with a ``waiter`` (starting the reaper if need be) the reaper owns its exit.
        The pid is registered before the reaper can see it exit."""
        with self._lock:
            if waiter is not None and not self._started:
                self._start()
            proc = subprocess.Popen(list(argv), **popen_kwargs)
            if waiter is not None:
                self._waiters[proc.pid] = waiter
                proc.returncode = 0  # never let Popen call waitpid itself: the reaper owns that
                self._lock.notify_all()
        return proc

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> tuple[subprocess.Popen, asyncio.Future[int]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        return self._popen(argv, (loop, future), **popen_kwargs), future

    def run_blocking(self, argv: Sequence[str], timeout: float | None, **popen_kwargs: Any) -> Completed:
        """Run to completion, blocking. Where the reaper runs it owns the exit (there Popen would read a
        child's status as 0); elsewhere the reaper is not started for this: Popen waits as usual."""
        future: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            owned = self._started
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        proc = self._popen(argv, (None, future) if owned else None, **pipes, **popen_kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
            code = future.result(timeout=timeout) if owned else proc.wait()
        except (subprocess.TimeoutExpired, concurrent.futures.TimeoutError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            if not owned:
                proc.wait()
            raise TimeoutError(f"{argv[0]} did not finish within {timeout}s") from None
        return Completed(list(argv), code, out, err)


def run_blocking(argv: Sequence[str], timeout: float | None = None, **popen_kwargs: Any) -> Completed:
    """``subprocess.run`` with captured output that stays correct in a process whose reaper (this
    module's, once :func:`spawn` started it) waits for every child."""
    return _reaper.run_blocking(argv, timeout, close_fds=True, **popen_kwargs)


def _resolve(future: asyncio.Future[int], code: int) -> None:
    if not future.done():
        future.set_result(code)


_reaper = _Reaper()


def spawn(argv: Sequence[str], **popen_kwargs: Any) -> tuple[subprocess.Popen, asyncio.Future[int]]:
    """Start a process; the future resolves to its exit code (negative: killed by that signal)."""
    return _reaper.spawn(argv, close_fds=True, **popen_kwargs)


async def run(
    argv: Sequence[str],
    *,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    pass_fds: Sequence[int] = (),
    timeout: float | None = None,
) -> Completed:
    """Run a command to completion without blocking the event loop."""
    proc, exited = spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=tuple(pass_fds))
    loop = asyncio.get_running_loop()
    reads = [
        loop.run_in_executor(None, pipe.read) if pipe is not None else _empty() for pipe in (proc.stdout, proc.stderr)
    ]
    try:
        out, err = await asyncio.wait_for(asyncio.gather(*reads), timeout)
        code = await asyncio.wait_for(exited, timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await exited
        raise
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return Completed(list(argv), code, out, err)


async def _empty() -> bytes:
    return b""


def pid_alive(pid: object) -> bool:
    """Whether a process exists and is not a zombie (works for processes that are not our children)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


async def wait_gone(pid: int, timeout: float) -> bool:
    """Poll until a process is gone; True if it went within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


def processes(match: Callable[[str], bool]) -> list[tuple[int, str]]:
    """(pid, command line) of the processes on the host whose command line ``match`` accepts."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if match(cmdline):
                found.append((int(entry), cmdline))
    return found
