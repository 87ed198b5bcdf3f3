"""The server side of a TLS connection whose ClientHello was already read (to learn its SNI).

asyncio's own TLS cannot take bytes that were read before it started, so this drives an ``ssl.SSLObject``
over memory buffers: what the client sent goes in, what TLS answers goes out through the raw writer. The
plaintext side reads like an ``asyncio.StreamReader`` (``read``, ``readexactly``, ``readuntil``) and writes
like a ``StreamWriter``; it pulls from the network only when asked, so a slow reader holds the client back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

CHUNK = 256 * 1024


class TlsClosed(ConnectionError):
    pass


class TlsServerStream:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext, first: bytes
    ) -> None:
        self.raw_reader, self.raw_writer = reader, writer
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.incoming.write(first)
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_side=True)
        self._buffer = bytearray()
        self._eof = False

    async def handshake(self) -> None:
        while True:
            try:
                self.tls.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                if not await self._receive():
                    raise TlsClosed("the client closed the connection during the TLS handshake") from None

    # ------------------------------------------------------------ reading plaintext

    async def _fill(self) -> bool:
        """More plaintext into the buffer; False at the end of the stream."""
        while not self._eof:
            try:
                data = self.tls.read(CHUNK)
            except ssl.SSLWantReadError:
                self._flush()  # TLS 1.3 may answer (a key update) while reading
                if not await self._receive():
                    self._eof = True
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._eof = True
                break
            if not data:
                self._eof = True
                break
            self._buffer += data
            return True
        return False

    async def _receive(self) -> bool:
        data = await self.raw_reader.read(CHUNK)
        if not data:
            self.incoming.write_eof()
            return False
        self.incoming.write(data)
        return True

    async def read(self, n: int = -1) -> bytes:
        if not self._buffer and not await self._fill():
            return b""
        size = len(self._buffer) if n < 0 else min(n, len(self._buffer))
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def readexactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), n)
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    async def readuntil(self, separator: bytes = b"\n", limit: int = 1 << 16) -> bytes:
        start = 0
        while (at := self._buffer.find(separator, start)) < 0:
            if len(self._buffer) > limit:
                raise asyncio.LimitOverrunError("a request head longer than the limit", len(self._buffer))
            start = max(0, len(self._buffer) - len(separator) + 1)
            if not await self._fill():
                raise asyncio.IncompleteReadError(bytes(self._buffer), None)
        end = at + len(separator)
        data = bytes(self._buffer[:end])
        del self._buffer[:end]
        return data

    # ------------------------------------------------------------ writing plaintext

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = self.tls.write(view[:CHUNK])
            view = view[written:]
        self._flush()

    async def drain(self) -> None:
        await self.raw_writer.drain()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        """TLS has no half-close that clients honour: close_notify, then the TCP write side."""
        with contextlib.suppress(ssl.SSLError):
            self.tls.unwrap()
        self._flush()
        if self.raw_writer.can_write_eof():
            with contextlib.suppress(OSError):
                self.raw_writer.write_eof()

    def close(self) -> None:
        self.raw_writer.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw_writer.get_extra_info(name, default)

    def _flush(self) -> None:
        if pending := self.outgoing.read():
            self.raw_writer.write(pending)
