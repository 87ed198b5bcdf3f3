"""Watching directories with inotify (through ctypes: the agent uses the standard library only).

One inotify instance per watch, read by the reads themselves (no thread of its own): a ``ReadWatch``
drains what the kernel queued, waiting with ``select`` up to its ``wait``. A recursive watch adds the
directories made below it as their creation is read. What nobody reads piles up to ``WATCH_QUEUE`` events
in the kernel (then ``IN_Q_OVERFLOW``, reported as ``lost``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import struct
import threading
import time

from . import protocol as P
from .processes import RequestError

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED, IN_ISDIR = 0x400, 0x800, 0x4000, 0x8000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL-padded to len)
KINDS = (
    (IN_CREATE | IN_MOVED_TO, "create"), (IN_MODIFY, "write"), (IN_DELETE, "remove"), (IN_MOVED_FROM, "rename"),
    (IN_ATTRIB, "chmod"),
)  # fmt: skip
MAX_WATCHES = 64  # per sandbox: each holds an inotify instance
MAX_DIRECTORIES = 8192  # per recursive watch


class _Libc:
    def __init__(self) -> None:
        import ctypes.util  # here, not at the top: the agent's boot does not pay for ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        self.lib.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)

    def init(self) -> int:
        fd = self.lib.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = self.ctypes.get_errno()
            raise OSError(code, "inotify_init1: " + os.strerror(code))
        return fd

    def add(self, fd: int, path: str) -> int:
        wd = self.lib.inotify_add_watch(fd, os.fsencode(path), MASK)
        if wd < 0:
            code = self.ctypes.get_errno()
            raise OSError(code, os.strerror(code), path)
        return wd


class _Watch:
    def __init__(self, libc: _Libc, path: str, recursive: bool) -> None:
        self.libc = libc
        self.root = path.rstrip("/") or "/"
        self.recursive = recursive
        self.fd = libc.init()
        self.dirs: dict[int, str] = {}
        self.lock = threading.Lock()
        self.lost = 0
        self.closed = False
        try:
            self._add(self.root)
            if recursive:
                for directory, subdirs, _ in os.walk(self.root):
                    for sub in subdirs:
                        self._add(os.path.join(directory, sub))
        except BaseException:
            os.close(self.fd)
            raise

    def _add(self, path: str) -> None:
        if len(self.dirs) >= MAX_DIRECTORIES:
            raise RequestError(P.ErrorKind.INVALID, f"more than {MAX_DIRECTORIES} directories below {self.root}")
        self.dirs[self.libc.add(self.fd, path)] = path

    def read(self, wait: float) -> P.WatchEvents:
        with self.lock:  # one reader at a time: events are handed out once
            deadline = time.monotonic() + wait
            events = self._drain()
            while not events and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                    break
                events = self._drain()
            lost, self.lost = self.lost, 0
            return P.WatchEvents(events=events, lost=lost, closed=self.closed)

    def _drain(self) -> list[P.WatchEvent]:
        events = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return events
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            offset = 0
            while offset < len(data):
                wd, mask, _, size = EVENT.unpack_from(data, offset)
                name = data[offset + EVENT.size : offset + EVENT.size + size].rstrip(b"\0").decode(errors="replace")
                offset += EVENT.size + size
                events += self._event(wd, mask, name)

    def _event(self, wd: int, mask: int, name: str) -> list[P.WatchEvent]:
        if mask & IN_Q_OVERFLOW:
            self.lost += 1
            return []
        directory = self.dirs.get(wd)
        if directory is None:
            return []
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
            self.dirs.pop(wd, None)
            if directory == self.root:
                self.closed = True
            return []
        path = os.path.join(directory, name)
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            with contextlib.suppress(OSError, RequestError):  # gone again already, or too many: unseen
                self._add(path)
        relative = os.path.relpath(path, self.root)
        return [P.WatchEvent(name=relative, type=kind) for bits, kind in KINDS if mask & bits]

    def close(self) -> None:
        os.close(self.fd)


class Watches:
    def __init__(self) -> None:
        self.libc: _Libc | None = None
        self.by_id: dict[str, _Watch] = {}
        self.lock = threading.Lock()
        self.counter = 0

    def start(self, req: P.StartWatch) -> P.WatchInfo:
        path = str(req.path)
        if not os.path.isdir(path):
            if not os.path.exists(path):
                raise RequestError(P.ErrorKind.FILE_NOT_FOUND, f"{path} does not exist")
            raise RequestError(P.ErrorKind.NOT_A_DIRECTORY, f"{path} is not a directory")
        with self.lock:
            if len(self.by_id) >= MAX_WATCHES:
                raise RequestError(P.ErrorKind.INVALID, f"{MAX_WATCHES} watches already: stop one first")
            self.libc = self.libc or _Libc()
            self.counter += 1
            watch_id = f"w-{self.counter}"
            self.by_id[watch_id] = _Watch(self.libc, path, bool(req.recursive))
        return P.WatchInfo(id=watch_id)

    def read(self, req: P.ReadWatch) -> P.WatchEvents:
        return self._get(str(req.id)).read(min(max(float(req.wait), 0.0), 60.0))

    def stop(self, req: P.StopWatch) -> P.Empty:
        with self.lock:
            watch = self.by_id.pop(str(req.id), None)
        if watch is None:
            raise RequestError(P.ErrorKind.PROCESS_NOT_FOUND, f"no watch {req.id!r}")
        with watch.lock:
            watch.close()
        return P.Empty()

    def _get(self, watch_id: str) -> _Watch:
        with self.lock:
            watch = self.by_id.get(watch_id)
        if watch is None:
            raise RequestError(P.ErrorKind.PROCESS_NOT_FOUND, f"no watch {watch_id!r}")
        return watch
