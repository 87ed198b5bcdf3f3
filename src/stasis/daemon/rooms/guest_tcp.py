"""A TCP connection to a port on a sandbox's loopback, for a sandbox without a network device.

The agent connects to 127.0.0.1:PORT itself (``ConnectPort``: the connection is one of its process
entries, its stdin the sending side, its stdout what arrives); an agent older than that starts a small
relay process instead (on the python the agent runs on). The daemon carries those streams over the
guest channel, as it does SSH's. To its caller it is an ordinary pair of asyncio streams (one end of a
socketpair). While it is open the sandbox counts as in use. It is slower than a connection into a
network namespace: every chunk is one call to the agent each way.

Nothing is dropped on the way. The agent reads the sandbox's socket only as fast as the daemon pulls (its
stdout is paced), and the daemon pulls only as fast as its caller reads (the socketpair fills, the send
waits); while it waits it tells the agent it is still there, so the agent never gives up on it. Should bytes
be lost all the same (an older agent, a channel that broke), the caller's reads fail with
ConnectionResetError: a connection that ends early is never handed over as one that ended.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import socket

from ...errors import GuestError, StasisError, Unsupported
from ...guest import protocol as P
from ...guest.client import GuestChannel
from ..core.service import SandboxService

log = logging.getLogger(__name__)

BUFFER = 8 << 20  # bytes the agent reads ahead of the daemon (it then stops reading the sandbox's socket)
CHUNK = 1 << 20
KEEPALIVE = 20.0  # seconds between "still here" pulls while the caller reads slowly (the agent waits 60 s)
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


class Lost(ConnectionResetError):
    """Bytes of the connection went missing in the sandbox (an agent that does not pace connections, or one that
    gave up on a reader silent for a minute): the connection is reset."""


async def open_guest_tcp(
    service: SandboxService, sandbox_id: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    ours, theirs = socket.socketpair()
    for sock in (ours, theirs):
        sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=ours)
    loop = asyncio.get_running_loop()
    connected: asyncio.Future[None] = loop.create_future()
    pump = loop.create_task(_pump(service, sandbox_id, port, theirs, connected, reader))
    try:
        await connected
    except BaseException:
        pump.cancel()
        writer.close()
        raise
    return reader, writer


async def _pump(
    service: SandboxService, sandbox_id: str, port: int, sock: socket.socket, connected: asyncio.Future[None],
    reader: asyncio.StreamReader,
) -> None:  # fmt: skip
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
                    if reply.stdout.lost:
                        raise Lost(f"the agent dropped {reply.stdout.lost} bytes of it before the daemon read them")
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
                        await _deliver(channel, session, sock, data, (out, err))
                    if reply.exit_code is not None and reply.stdout.eof:
                        return
            finally:
                with contextlib.suppress(StasisError):
                    await channel.call(P.WriteStdin(id=session, close=True))
                    await channel.call(P.SignalProcess(id=session, signal="SIGKILL", tree=False))
    except (StasisError, OSError) as exc:
        if not connected.done():
            connected.set_exception(exc)
        else:  # its reader sees an error, not an early end that looks like the whole answer
            reader.set_exception(ConnectionResetError(f"port {port} of sandbox {sandbox_id}: {exc}"))
        level = logging.WARNING if isinstance(exc, Lost) else logging.DEBUG
        log.log(level, "port %d of %s through the agent ended: %s", port, sandbox_id, exc)
    finally:
        if upstream is not None:
            upstream.cancel()
        sock.close()


async def _deliver(
    channel: GuestChannel, session: str, sock: socket.socket, data: bytes, offsets: tuple[int, int]
) -> None:
    """Hand ``data`` to the caller's side, as slowly as it reads. Meanwhile a pull of nothing every KEEPALIVE
    seconds tells the agent its reader is still here: it keeps waiting instead of letting bytes go."""
    sending = asyncio.ensure_future(asyncio.get_running_loop().sock_sendall(sock, data))
    try:
        while not (await asyncio.wait({sending}, timeout=KEEPALIVE))[0]:
            alive = P.ReadStreams(id=session, stdout_offset=offsets[0], stderr_offset=offsets[1], max_bytes=0)
            await channel.call(alive, timeout=60)
        sending.result()
    finally:
        sending.cancel()


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
    cmd = [*service.python_argv(service.lookup(sandbox_id)), "-I", "-S", "-c", RELAY, str(port)]
    await channel.call(P.StartProcess(cmd=cmd, id=session, stdin=True, max_output=BUFFER, paced=True))
    return True


async def _upstream(channel: GuestChannel, sock: socket.socket, session: str) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, StasisError):
        while data := await loop.sock_recv(sock, CHUNK):
            await channel.call(P.WriteStdin(id=session, data=base64.b64encode(data).decode()))
        await channel.call(P.WriteStdin(id=session, close=True))
