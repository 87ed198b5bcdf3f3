"""A TCP connection to a port on a sandbox's loopback, for a sandbox without a network device.

The agent connects to 127.0.0.1:PORT itself (``ConnectPort``: the connection is one of its process
entries, its stdin the sending side, its stdout what arrives); an agent older than that starts a small
relay process instead (on the python the agent runs on). The daemon carries those streams over the
guest channel, as it does SSH's. To its caller it is an ordinary pair of asyncio streams (one end of a
socketpair). While it is open the sandbox counts as in use. It is slower than a connection into a
network namespace: every chunk is one call to the agent each way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import socket

from ..errors import GuestError, StasisError, Unsupported
from ..guest import protocol as P
from ..guest.client import GuestChannel
from .service import SandboxService

log = logging.getLogger(__name__)

BUFFER = 8 << 20  # bytes of the relay's output the agent holds for a reader that lags
CHUNK = 1 << 20
REFUSED = 111
# Writes one byte once connected (so the daemon can tell a refused port from an empty reply).
RELAY = r"""
import os, socket, sys, threading
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
except OSError as exc:
    print(exc, file=sys.stderr); sys.exit(111)
s.settimeout(None)
os.write(1, b"+")
def upstream():
    while data := os.read(0, 1 << 16):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=upstream, daemon=True).start()
while data := s.recv(1 << 16):
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
"""


async def open_guest_tcp(
    service: SandboxService, sandbox_id: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setblocking(False)
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[None] = loop.create_future()
    pump = loop.create_task(_pump(service, sandbox_id, port, theirs, connected))
    try:
        await connected
    except BaseException:
        pump.cancel()
        ours.close()
        raise
    return await asyncio.open_connection(sock=ours)


async def _pump(
    service: SandboxService, sandbox_id: str, port: int, sock: socket.socket, connected: asyncio.Future[None]
) -> None:
    session = f"port-{port}-{secrets.token_hex(4)}"
    loop = asyncio.get_running_loop()
    upstream: asyncio.Task[None] | None = None
    try:
        async with service.guest(sandbox_id) as channel:
            relayed = await _open(service, channel, sandbox_id, session, port)
            if not relayed:  # connected by the agent itself: no "+" to wait for
                connected.set_result(None)
                upstream = loop.create_task(_upstream(channel, sock, session))
            try:
                out = err = 0
                while True:
                    read = P.ReadStreams(id=session, stdout_offset=out, stderr_offset=err, max_bytes=CHUNK, wait=10)
                    reply = await channel.call(read, timeout=60)
                    data = base64.b64decode(reply.stdout.data)
                    out, err = reply.stdout.next_offset, reply.stderr.next_offset
                    if not connected.done():
                        if data[:1] == b"+":
                            connected.set_result(None)
                            data = data[1:]
                            upstream = loop.create_task(_upstream(channel, sock, session))
                        elif reply.exit_code is not None:
                            why = base64.b64decode(reply.stderr.data).decode(errors="replace").strip()
                            connected.set_exception(ConnectionRefusedError(REFUSED, why or "connection refused"))
                            return
                    if data:
                        await loop.sock_sendall(sock, data)
                    if reply.exit_code is not None and reply.stdout.eof:
                        return
            finally:
                with contextlib.suppress(StasisError):
                    await channel.call(P.WriteStdin(id=session, close=True))
                    await channel.call(P.SignalProcess(id=session, signal="SIGKILL", tree=False))
    except (StasisError, OSError) as exc:
        if not connected.done():
            connected.set_exception(exc)
        log.debug("port %d of %s through the agent ended: %s", port, sandbox_id, exc)
    finally:
        if upstream is not None:
            upstream.cancel()
        sock.close()


async def _open(service: SandboxService, channel: GuestChannel, sandbox_id: str, session: str, port: int) -> bool:
    """Connect through the agent; True when that took a relay process (an older agent), which says "+" first."""
    try:
        await channel.call(P.ConnectPort(id=session, port=port, max_output=BUFFER))
        return False
    except Unsupported:
        pass
    except GuestError as exc:
        if exc.details.get("guest_error") == P.ErrorKind.REFUSED:
            raise ConnectionRefusedError(REFUSED, exc.message) from None
        raise
    cmd = [*service.boxes.python_argv(service.lookup(sandbox_id)), "-I", "-S", "-c", RELAY, str(port)]
    await channel.call(P.StartProcess(cmd=cmd, id=session, stdin=True, max_output=BUFFER))
    return True


async def _upstream(channel: GuestChannel, sock: socket.socket, session: str) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, StasisError):
        while data := await loop.sock_recv(sock, CHUNK):
            await channel.call(P.WriteStdin(id=session, data=base64.b64encode(data).decode()))
        await channel.call(P.WriteStdin(id=session, close=True))
