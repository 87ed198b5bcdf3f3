"""Passwordless sudo where setuid cannot work: gVisor ignores setuid bits, so an image's ``/usr/bin/sudo`` cannot
raise anyone to root there. The agent, root in the sandbox, runs a command for a user the image names in
``ALLOWED`` (E2B's images: ``user``, whose sudoers line is ``NOPASSWD: ALL``) as the user it asks for, with the
caller's own stdin, stdout and stderr, passed over a unix socket with the request. The images' ``sudo``
(:mod:`.sudo_shim`) asks here when its socket is there and runs the real sudo otherwise. The backend turns it
on (``STASIS_SUDO_BROKER=1``: gVisor); a microVM's sudo is the real one.

Who asks is told by the file system, not by the socket: each allowed user has a socket of their own,
``SOCKETS/NAME``, theirs and mode 0600, in a directory only root can write (``/dev``: the sandbox kernel's own
memory, so a suspend keeps the listeners). gVisor's SO_PEERCRED is not relied on: older releases report the
asker's own credentials.

A request: 4 bytes of length (big-endian) with the three descriptors, then that many bytes of JSON
``{"argv", "env", "cwd", "user"}``; then lines ``{"signal": N}`` to forward. The reply: one line ``{"exit": N}``
(``-N``: killed by signal N) or ``{"error": "..."}``. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

SOCKETS = "/dev/stasis-sudo"  # SOCKETS/NAME: the one NAME may connect to (it is theirs, 0600)
ALLOWED = "/etc/stasis/sudo-users"  # one user name a line: who may run anything as anyone, no password
MAX_REQUEST = 1 << 20
MAX_SIGNAL_LINE = 64
REQUEST_TIMEOUT = 30.0  # seconds to send a request once connected
AT_ONCE = 64  # requests read and started at a time; the next asker waits


def start(table: Any) -> None:
    """Serve requests in threads of the agent, if the backend asks for it and the image names users. ``table``:
    the agent's process table, whose reaper (the agent is init) collects the commands' exits."""
    if os.environ.get("STASIS_SUDO_BROKER") != "1":
        return
    try:
        with open(ALLOWED) as f:
            names = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return
    slots = threading.BoundedSemaphore(AT_ONCE)
    for name in names:
        try:
            entry = pwd.getpwnam(name)
            listener = _listen(entry)
        except (KeyError, OSError) as exc:
            print(f"stasis agent: no sudo for {name!r}: {exc}", file=sys.stderr)
            continue
        threading.Thread(target=_serve, args=(listener, table, slots), daemon=True, name=f"sudo-{name}").start()


def _listen(entry: pwd.struct_passwd) -> socket.socket:
    os.makedirs(SOCKETS, mode=0o755, exist_ok=True)
    if os.lstat(SOCKETS).st_uid != 0:
        raise PermissionError(f"{SOCKETS} is not root's")
    os.chmod(SOCKETS, 0o755)
    path = os.path.join(SOCKETS, entry.pw_name)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    os.chmod(path, 0o600)
    listener.listen(16)
    return listener


def _serve(listener: socket.socket, table: Any, slots: threading.BoundedSemaphore) -> None:
    while True:
        slots.acquire()  # before accepting: a flood of askers waits in the listen queue, not in threads
        try:
            conn, _ = listener.accept()
        except OSError:
            slots.release()
            time.sleep(0.1)  # EMFILE and the like: no busy loop in pid 1
            continue
        try:
            threading.Thread(target=_handle, args=(conn, table, slots), daemon=True).start()
        except RuntimeError:  # no thread to be had: this asker is turned away, the listener stays
            conn.close()
            slots.release()
            time.sleep(0.1)


def _handle(conn: socket.socket, table: Any, slots: threading.BoundedSemaphore) -> None:
    with conn:
        _answer(conn, table, slots)
        with contextlib.suppress(OSError):  # the signal reader's file holds the socket: end it for both
            conn.shutdown(socket.SHUT_RDWR)


def _answer(conn: socket.socket, table: Any, slots: threading.BoundedSemaphore) -> None:
    """One request: its slot is held while it is read and started (a command that runs long holds none)."""
    fds: list[int] = []
    try:
        conn.settimeout(REQUEST_TIMEOUT)
        head, fds, _, _ = socket.recv_fds(conn, 4, 3, socket.MSG_CMSG_CLOEXEC)
        if len(head) != 4 or len(fds) != 3:
            raise ValueError("a request is 4 bytes of length with three descriptors")
        (length,) = struct.unpack("!I", head)
        if length > MAX_REQUEST:
            raise ValueError(f"a request of {length} bytes is more than {MAX_REQUEST}")
        request = json.loads(_read(conn, length))
        argv, env, cwd, target = _checked(request)
        conn.settimeout(None)
        pid = table.start_other(lambda: _popen(argv, env, cwd, target, fds))
    except Exception as exc:  # said to the asker, who prints it as sudo would
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
        return
    finally:
        slots.release()
        for fd in fds:
            os.close(fd)
    threading.Thread(target=_signals, args=(conn, pid, table), daemon=True).start()
    code = table.wait_other(pid)
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"exit": code}).encode() + b"\n")


def _checked(request: Any) -> tuple[list[str], dict[str, str], str, tuple[int, int, list[int]]]:
    """The request's command, environment, directory and user (uid, gid, groups), looked up before any lock."""
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd") or "/"
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env must map strings to strings")
    entry = pwd.getpwnam(str(request.get("user") or "root"))
    if not isinstance(cwd, str) or not os.path.isdir(cwd):
        cwd = entry.pw_dir if os.path.isdir(entry.pw_dir) else "/"
    return argv, env, cwd, (entry.pw_uid, entry.pw_gid, os.getgrouplist(entry.pw_name, entry.pw_gid))


def _popen(argv: list[str], env: dict[str, str], cwd: str, target: tuple[int, int, list[int]],
           fds: list[int]) -> subprocess.Popen[bytes]:  # fmt: skip
    uid, gid, groups = target
    try:  # a session of its own: its signals and a `kill 0` in it never reach the agent
        return subprocess.Popen(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], env=env, cwd=cwd, user=uid,
                                group=gid, extra_groups=groups, close_fds=True, start_new_session=True)  # fmt: skip
    except FileNotFoundError:
        raise FileNotFoundError(f"{argv[0]}: command not found") from None


def _signals(conn: socket.socket, pid: int, table: Any) -> None:
    """The asker's signals (Ctrl-C, a kill), forwarded to the command's group, until the asker hangs up."""
    with contextlib.suppress(OSError, ValueError), conn.makefile("rb") as lines:
        while line := lines.readline(MAX_SIGNAL_LINE):
            asked = json.loads(line)
            number = asked.get("signal") if isinstance(asked, dict) else None
            with table.lock:  # only while it runs: its pid is not reused before its exit is collected
                if isinstance(number, int) and 0 < number < 65 and table.others.get(pid, 0) is None:
                    os.killpg(pid, number)


def _read(conn: socket.socket, length: int) -> bytes:
    data = bytearray()
    while len(data) < length:
        piece = conn.recv(min(1 << 16, length - len(data)))
        if not piece:
            raise ValueError("the request ended early")
        data += piece
    return bytes(data)
