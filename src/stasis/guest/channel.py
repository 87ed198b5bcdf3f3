"""The framing of the guest protocol: JSON lines with request ids over a byte stream.

One reader task matches replies to waiting callers by request id. Replies nobody
waits for (left in the pipe by a previous daemon, or for a caller that gave up)
are dropped. When the stream closes every waiter gets ``GuestDisconnected``.
Typed requests are :class:`stasis.guest.client.GuestChannel`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Self

from ..errors import GuestDisconnected, GuestTimeout
from .wire import cancel_line

log = logging.getLogger(__name__)

STREAM_LIMIT = 64 << 20  # longest reply line (a 4 MiB chunk is ~5.6 MB of base64)
CANCEL_WRITE_TIMEOUT = 5.0


class JsonLinesChannel:
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: _PipeWriter | _StreamWriter,
        label: str,
        read_transport: asyncio.BaseTransport | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._read_transport = read_transport
        self.label = label
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._prefix = secrets.token_hex(4)  # ids never collide with a previous daemon's
        self._closed = False
        self._cancels: set[asyncio.Task[None]] = set()
        self._reader_task = asyncio.get_running_loop().create_task(self._read_replies())

    @classmethod
    async def open_fifos(cls, to_guest: Path, from_guest: Path, label: str) -> Self:
        """Open our own ends of the FIFO pair (O_RDWR: never EOF, never blocks on open)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT)
        read_file = os.fdopen(os.open(from_guest, os.O_RDWR | os.O_CLOEXEC), "rb", buffering=0)
        read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), read_file)
        writer = _PipeWriter(os.open(to_guest, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK))
        return cls(reader, writer, label, read_transport)

    @classmethod
    async def open_unix(cls, path: Path, label: str) -> Self:
        """Connect to a unix socket that carries the agent's stream (a microVM's virtio-serial port)."""
        reader, writer = await asyncio.open_unix_connection(str(path), limit=STREAM_LIMIT)
        return cls(reader, _StreamWriter(writer), label)

    @property
    def closed(self) -> bool:
        return self._closed

    async def _request(self, message: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """Send one request line and wait for the reply with its id (raw: ``ok``/``result``/``error``)."""
        if self._closed:
            raise GuestDisconnected(f"channel to {self.label} is closed")
        req_id = f"{self._prefix}-{next(self._ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = future
        if timeout is not None:
            message = {**message, "expires": round(time.time() + timeout, 3)}  # the agent refuses it after that
        line = json.dumps({"id": req_id, **message}, separators=(",", ":")) + "\n"
        try:
            try:
                await asyncio.wait_for(self._writer.write(line.encode()), timeout)
            except TimeoutError:
                # The agent stopped reading: take back what it did not read, so that it never runs later.
                self._writer.discard_unread()
                await self.close()
                raise
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError:
                self._cancel(req_id)
                raise
        except TimeoutError:
            raise GuestTimeout(
                f"the agent in {self.label} did not answer {message.get('op')!r} within {timeout:.0f}s "
                "(if it had not started by then, it never will: the agent refuses a request that comes too late)",
                op=message.get("op"),
            ) from None
        finally:
            self._pending.pop(req_id, None)

    def _cancel(self, req_id: str) -> None:
        """Tell the agent we gave up on ``req_id``: if it has not read the request yet, it reads the cancel
        with it and drops both (a stopped guest's clock cannot be trusted to expire it)."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._write_quietly(cancel_line(req_id)))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    async def _write_quietly(self, data: bytes) -> None:
        try:
            await asyncio.wait_for(self._writer.write(data), CANCEL_WRITE_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            log.info("%s: could not send a cancel to the agent: %s", self.label, exc)

    async def _read_replies(self) -> None:
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                try:
                    reply = json.loads(line)
                except ValueError:
                    log.warning("%s: unparseable line from agent: %.200r", self.label, line)
                    continue
                future = self._pending.get(str(reply.get("id")))
                if future is not None and not future.done():
                    future.set_result(reply)
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("%s: channel read failed: %s", self.label, exc)
        finally:
            self._fail_pending()

    def _fail_pending(self) -> None:
        self._closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(GuestDisconnected(f"lost the connection to the agent in {self.label}"))

    async def close(self) -> None:
        if self._reader_task.done() and self._closed:
            return
        for task in list(self._cancels):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._writer.close()
        if self._read_transport is not None:
            self._read_transport.close()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        self._fail_pending()


class _PipeWriter:
    """Non-blocking writes to our end of a FIFO.

    asyncio's write-pipe transport treats a readable fd as "peer closed"; our FIFO
    end is opened O_RDWR (so it never sees EOF) and is readable whenever a request
    waits in it, so that transport would close itself. This writer only writes.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = asyncio.Lock()

    async def write(self, data: bytes) -> None:
        loop = asyncio.get_running_loop()
        view = memoryview(data)
        async with self._lock:  # one request's bytes are never interleaved with another's
            while view:
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    writable = loop.create_future()
                    loop.add_writer(self._fd, writable.set_result, None)
                    try:
                        await writable
                    finally:
                        loop.remove_writer(self._fd)

    def discard_unread(self) -> int:
        """Read back the bytes the agent has not read yet (our end is O_RDWR), then end any half line.

        Returns how many bytes were taken back. The agent sees at most one broken line, which it
        answers with an error nobody waits for."""
        taken = 0
        with contextlib.suppress(OSError):
            while chunk := os.read(self._fd, 1 << 16):
                taken += len(chunk)
        with contextlib.suppress(OSError):
            os.write(self._fd, b"\n")
        return taken

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _StreamWriter:
    """Whole requests onto an asyncio stream, one at a time."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._lock = asyncio.Lock()

    async def write(self, data: bytes) -> None:
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    def discard_unread(self) -> int:
        return 0  # a socket gives nothing back; the connection is closed instead

    def close(self) -> None:
        self._writer.close()
