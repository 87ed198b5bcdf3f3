"""A port of the sandbox's loopback as a process entry (``P.ConnectPort``): the daemon reaches a port of a sandbox
without network through the agent, with nothing started in the sandbox. Its stdout is what the socket receives,
its stdin (``SocketInput``) what it sends; it exits 0 when the connection ends.

Its stdout is always paced: the agent reads the socket only as fast as the reader takes the bytes (at most the
buffer's limit ahead of what it has acknowledged), so a lagging reader slows the sandbox's sender down, as TCP
would, instead of losing bytes. Only a reader silent for ``PACE_TIMEOUT`` (gone) lets the oldest bytes go, and
its next read says how many (``lost``): never a silent gap."""

from __future__ import annotations

import contextlib
import socket

from . import protocol as P
from .processes import Process, ProcessTable, RequestError, start_thread


class SocketInput:
    """A connection's sending side, as a process's stdin: close() is a half-close (the peer reads its end)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)


def connect(table: ProcessTable, port: int, proc_id: str, limit: int) -> Process:
    """A connection to 127.0.0.1:PORT; refused: REFUSED, said as the socket says it."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError as exc:
        raise RequestError(P.ErrorKind.REFUSED, f"port {port}: {exc.strerror or exc}") from exc
    sock.settimeout(None)
    proc = Process(0, proc_id, None, ["tcp", f"127.0.0.1:{port}"], limit)
    proc.socket, proc.stdin = sock, SocketInput(sock)
    proc.stdout.paced = True
    proc.stderr.closed = True
    try:
        table.add_connection(proc)
    except RequestError:
        sock.close()
        raise
    start_thread(_pump, table, proc, sock)
    return proc


def _pump(table: ProcessTable, proc: Process, sock: socket.socket) -> None:
    try:
        table.pump(sock.fileno(), proc.stdout)
    finally:
        sock.close()
        table.end_connection(proc)
