"""The client side of an HTTP/1 connection, one request at a time.

An exposed port's proxy must rewrite every request's head (no stasis token or console cookie ever
reaches a sandbox's app), not only the first: a browser sends a page's later requests over the same
keep-alive connection. So the client's bytes are read as requests: a head, then a body framed by
``Content-Length`` or ``chunked``; an ``Upgrade`` (a WebSocket) turns the rest into raw bytes.
Responses need no parsing and go back as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Protocol

from .relay import pipe

COPY_CHUNK = 1 << 16


class Reader(Protocol):
    """What a body is read from: an ``asyncio.StreamReader``, or the plaintext of a TLS stream the proxy ends."""

    async def read(self, n: int = -1) -> bytes: ...


class BadRequest(ValueError):
    """Not a request this proxy can frame (the connection is closed)."""


def framing(head: bytes) -> int | str:
    """How the body after ``head`` ends: its length, ``"chunked"``, or ``"raw"`` (an upgrade: the rest of
    the connection belongs to another protocol)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        key, value = name.strip().lower(), value.strip().lower()
        if key == b"upgrade":
            return "raw"
        if key == b"transfer-encoding":
            if value.endswith(b"chunked"):
                return "chunked"
            raise BadRequest("a transfer-encoding other than chunked")
        if key == b"content-length":
            if not value.isdigit():
                raise BadRequest("a content-length that is not a number")
            length = int(value)
    return length


async def forward_requests(
    client: asyncio.StreamReader,
    upstream: asyncio.StreamWriter,
    first_head: bytes,
    rewrite: Callable[[bytes], bytes],
    on_data: Callable[[], None] = lambda: None,
) -> None:
    """Send ``first_head`` (already rewritten) and its body, then every following request with its head
    passed through ``rewrite``, until the client closes; then close ``upstream``'s write side."""
    head = first_head
    try:
        while True:
            upstream.write(head)
            on_data()
            body = framing(head)
            if body == "raw":
                await pipe(client, upstream, on_data)
                return
            if body == "chunked":
                await _copy_chunked(client, upstream)
            else:
                await copy_exactly(client, upstream, int(body))
            await upstream.drain()
            try:
                head = rewrite(await client.readuntil(b"\r\n\r\n"))
            except asyncio.IncompleteReadError:
                return  # the client is done
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, BadRequest, ValueError, ConnectionError):
        return
    finally:
        if upstream.can_write_eof():
            with contextlib.suppress(OSError):
                upstream.write_eof()


async def copy_exactly(client: Reader, upstream: asyncio.StreamWriter, size: int) -> int:
    """Copy ``size`` bytes of body; the bytes copied."""
    total = size
    while size > 0:
        data = await client.read(min(size, COPY_CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", size)
        upstream.write(data)
        size -= len(data)
        await upstream.drain()
    return total


async def _copy_chunked(client: asyncio.StreamReader, upstream: asyncio.StreamWriter) -> None:
    while True:
        line = await client.readuntil(b"\r\n")
        upstream.write(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadRequest("a chunk size that is not hexadecimal") from None
        if size == 0:
            while (trailer := await client.readuntil(b"\r\n")) != b"\r\n":
                upstream.write(trailer)
            upstream.write(b"\r\n")
            return
        await copy_exactly(client, upstream, size + 2)  # the chunk and its CRLF
