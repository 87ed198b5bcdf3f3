"""Running host commands (runsc, qemu-img, ...) from the daemon, and reaping what they leave.

``runsc run -detach`` forks a sandbox and exits; the orphaned sandbox is
re-parented to the nearest *subreaper*. If that is the host's init, it may reap
slowly (here: 1-2 s), and ``runsc delete`` waits for it. So the process that
drives runsc makes itself a child subreaper and reaps every child in one thread,
handing each exit status to whoever started that pid.

Nothing else in such a process may wait for children (``subprocess.run``, asyncio
subprocesses): use :func:`run`, :func:`spawn`, :func:`run_blocking` and
:func:`start_blocking`. A process that must (a test session) calls
:func:`share_children`.
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
_grace = 0.0  # seconds an unregistered child's exit is left to whoever started it (see share_children)


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
        self._spawned = 0  # children started so far: a start between a look and a wait is not missed

    def _start(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("could not become a child subreaper (errno %d)", ctypes.get_errno())
        threading.Thread(target=self._reap_forever, name="child-reaper", daemon=True).start()
        self._started = True

    def _reap_forever(self) -> None:
        unknown: dict[int, float] = {}  # exited children nobody registered -> when first seen
        while True:
            with self._lock:
                spawned = self._spawned
            try:  # look, do not reap yet; poll while an unknown child waits for its owner
                exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT | (os.WNOHANG if unknown else 0))
            except ChildProcessError:
                unknown.clear()
                with self._lock:  # no children: sleep until one starts, unless one started since we looked
                    if self._spawned == spawned:
                        self._lock.wait(1.0)
                continue
            if exited is not None and not self._deliver(exited.si_pid):
                unknown.setdefault(exited.si_pid, time.monotonic())
            if unknown:
                # waitid keeps naming the same unknown child: look at the registered ones by pid
                with self._lock:
                    registered = list(self._waiters)
                for pid in registered:
                    if _exited(pid):
                        self._deliver(pid)
                self._settle(unknown)
                time.sleep(0.005)

    def _deliver(self, pid: int) -> bool:
        """Reap ``pid`` and hand its exit status over, if someone registered it."""
        with self._lock:
            waiter = self._waiters.pop(pid, None)
        if waiter is None:
            return False
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return True
        self._hand_over(waiter, os.waitstatus_to_exitcode(status))
        return True

    @staticmethod
    def _settle(unknown: dict[int, float]) -> None:
        """An exited child nobody registered is an orphan re-parented to us (reap it), or a child that
        other code started with subprocess and is about to wait for: leave it its status a moment."""
        for pid, seen in list(unknown.items()):
            if not _exited(pid):
                del unknown[pid]  # waited for by its owner
            elif time.monotonic() - seen >= _grace:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                del unknown[pid]

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

    def _popen(self, argv: Sequence[str], waiter: tuple[asyncio.AbstractEventLoop | None, Any] | None,
               **popen_kwargs: Any) -> subprocess.Popen:  # fmt: skip
        """Start a process; with a ``waiter`` (starting the reaper if need be) the reaper owns its exit.
        The pid is registered before the reaper can see it exit."""
        with self._lock:
            if waiter is not None and not self._started:
                self._start()
            proc = subprocess.Popen(list(argv), **popen_kwargs)
            self._spawned += 1
            if waiter is not None:
                self._waiters[proc.pid] = waiter
                proc.returncode = 0  # never let Popen call waitpid itself: the reaper owns that
                self._lock.notify_all()
        return proc

    def spawn(self, argv: Sequence[str], **popen_kwargs: Any) -> tuple[subprocess.Popen, asyncio.Future[int]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        return self._popen(argv, (loop, future), **popen_kwargs), future

    def start_blocking(self, argv: Sequence[str], **popen_kwargs: Any) -> Started:
        """Where the reaper runs it owns the exit (there Popen would read a child's status as 0);
        elsewhere the reaper is not started for this: Popen waits as usual."""
        with self._lock:
            owned = self._started
        future: concurrent.futures.Future[int] | None = concurrent.futures.Future() if owned else None
        return Started(self._popen(argv, (None, future) if future else None, **popen_kwargs), future)


@dataclass
class Started:
    """A process started by :func:`start_blocking`; :meth:`wait` gives its real exit status."""

    proc: subprocess.Popen
    _exit: concurrent.futures.Future[int] | None  # the reaper's report, where the reaper runs

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._exit.result(timeout) if self._exit is not None else self.proc.wait(timeout)
        except (subprocess.TimeoutExpired, concurrent.futures.TimeoutError):
            raise TimeoutError(f"{self.proc.args[0]} did not finish within {timeout}s") from None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        if self._exit is None:
            self.proc.wait()


def start_blocking(argv: Sequence[str], **popen_kwargs: Any) -> Started:
    """``subprocess.Popen`` whose exit status stays right in a process whose reaper (this module's,
    once :func:`spawn` started it) waits for every child."""
    return _reaper.start_blocking(argv, close_fds=True, **popen_kwargs)


def run_blocking(argv: Sequence[str], timeout: float | None = None, **popen_kwargs: Any) -> Completed:
    """``subprocess.run`` with captured output, right about the exit status wherever it runs."""
    started = start_blocking(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen_kwargs)
    try:
        out, err = started.proc.communicate(timeout=timeout)
        code = started.wait(timeout)
    except (subprocess.TimeoutExpired, TimeoutError):
        started.kill()
        raise TimeoutError(f"{argv[0]} did not finish within {timeout}s") from None
    return Completed(list(argv), code, out, err)


def share_children(grace: float = 0.25) -> None:
    """For a process that also starts children with plain ``subprocess`` (a test session): the reaper
    leaves an exit it does not know to its owner for ``grace`` seconds before taking it as an orphan's.
    The daemon does not: runsc waits for its orphans, so they are reaped at once. The reaper starts now: the
    sandboxes of a daemon this process started and SIGKILLed are its orphans then, reaped within ``grace``
    (left to this host's init, each made `runsc delete` wait ~1.3 s)."""
    global _grace
    _grace = grace
    with _reaper._lock:
        if not _reaper._started:
            _reaper._start()


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited and nobody has reaped it yet."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return False


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
    except BaseException:
        # Timed out, or the caller was cancelled: the command must not go on behind its back (a `runsc
        # restore` finishing after its create was rolled back would leave a sandbox nobody owns).
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        await asyncio.shield(exited)
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
