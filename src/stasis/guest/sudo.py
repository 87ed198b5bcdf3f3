"""Passwordless sudo where setuid cannot work: gVisor ignores setuid bits, so an image's ``/usr/bin/sudo`` cannot
raise anyone to root there. The agent, root in the sandbox, runs a command for a user the image names in
``ALLOWED`` (E2B's images: ``user``, whose sudoers line is ``NOPASSWD: ALL``) as the user it asks for, with the
caller's own stdin, stdout and stderr, passed over a unix socket with the request. The images' ``sudo``
(:mod:`.sudo_shim`) asks here when this socket answers and runs the real sudo otherwise. The backend turns it
on (``STASIS_SUDO_BROKER=1``: gVisor); a microVM's sudo is the real one.

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
from typing import Any

ADDRESS = "\0stasis-sudo"  # abstract: no file to leave behind, nothing for a checkpoint to carry
ALLOWED = "/etc/stasis/sudo-users"  # one user name a line: who may run anything as anyone, no password
MAX_REQUEST = 1 << 20
PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid


def start(table: Any) -> None:
    """Serve requests in a thread of the agent, if the backend asks for it and the image names users. ``table``:
    the agent's process table, whose reaper (the agent is init) collects the commands' exits."""
    if os.environ.get("STASIS_SUDO_BROKER") != "1":
        return
    try:
        with open(ALLOWED) as f:
            names = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    except OSError:
        return
    uids = set()
    for name in names:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(name).pw_uid)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(ADDRESS)
        listener.listen(16)
    except OSError as exc:
        print(f"stasis agent: no sudo for {names}: {exc}", file=sys.stderr)
        listener.close()
        return
    threading.Thread(target=_serve, args=(listener, uids, table), daemon=True, name="sudo").start()


def _serve(listener: socket.socket, uids: set[int], table: Any) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_handle, args=(conn, uids, table), daemon=True).start()


def _handle(conn: socket.socket, uids: set[int], table: Any) -> None:
    with conn:
        fds: list[int] = []
        try:
            _, uid, _ = PEER.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size))
            head, fds, _, _ = socket.recv_fds(conn, 4, 3)
            if uid != 0 and uid not in uids:
                raise PermissionError(f"uid {uid} may not use sudo here (not in {ALLOWED})")
            if len(head) != 4 or len(fds) != 3:
                raise ValueError("a request is 4 bytes of length with three descriptors")
            (length,) = struct.unpack("!I", head)
            if length > MAX_REQUEST:
                raise ValueError(f"a request of {length} bytes is more than {MAX_REQUEST}")
            request = json.loads(_read(conn, length))
            pid = table.start_other(lambda: _start(request, fds))
        except Exception as exc:  # said to the caller, who prints it as sudo would
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"error": str(exc)}).encode() + b"\n")
            return
        finally:
            for fd in fds:
                os.close(fd)
        threading.Thread(target=_signals, args=(conn, pid, table), daemon=True).start()
        code = table.wait_other(pid)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code}).encode() + b"\n")


def _start(request: dict[str, Any], fds: list[int]) -> subprocess.Popen[bytes]:
    argv, env, cwd = request["argv"], request["env"], request.get("cwd") or "/"
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError("argv must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise ValueError("env must map strings to strings")
    target = pwd.getpwnam(str(request.get("user") or "root"))
    if not os.path.isdir(cwd):
        cwd = target.pw_dir if os.path.isdir(target.pw_dir) else "/"
    try:
        return subprocess.Popen(
            argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], env=env, cwd=cwd, user=target.pw_uid,
            group=target.pw_gid, extra_groups=os.getgrouplist(target.pw_name, target.pw_gid), close_fds=True,
        )  # fmt: skip
    except FileNotFoundError:
        raise FileNotFoundError(f"{argv[0]}: command not found") from None


def _signals(conn: socket.socket, pid: int, table: Any) -> None:
    """The caller's signals (Ctrl-C, a kill), forwarded to the command, until the caller hangs up."""
    with contextlib.suppress(OSError, ValueError), conn.makefile("rb") as lines:
        for line in lines:
            number = json.loads(line).get("signal")
            with table.lock:  # only while it runs: its pid is not reused before its exit is collected
                if isinstance(number, int) and 0 < number < 65 and pid in table.others and table.others[pid] is None:
                    os.kill(pid, number)


def _read(conn: socket.socket, length: int) -> bytes:
    data = bytearray()
    while len(data) < length:
        piece = conn.recv(min(1 << 16, length - len(data)))
        if not piece:
            raise ValueError("the request ended early")
        data += piece
    return bytes(data)
