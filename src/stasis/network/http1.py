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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .relay import pipe

COPY_CHUNK = 1 << 16
TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
REQUEST_LINE = re.compile(rb"(" + TOKEN + rb") ([\x21-\x7e]+) HTTP/1\.[01]")
FIELD_NAME = re.compile(TOKEN)
AUTHORITY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(:[0-9]{0,5})?")  # host[:port], lower-cased
CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(;[\x20-\x7e\t]*)?\r\n")


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


@dataclass(frozen=True)
class Request:
    """A request head as :func:`parse_strictly` read it."""

    body: int | str  # as framing() says
    hosts: frozenset[str]  # every name it gives for its host: the Host header, an absolute or CONNECT target


def parse_strictly(head: bytes) -> Request:
    """Read a head (ending in CRLF CRLF) by RFC 9112's grammar, refusing (BadRequest) whatever two parsers could
    read two ways: a bare CR or LF, a folded line, a header name with spaces, more than one Content-Length,
    Transfer-Encoding or Host, Content-Length with Transfer-Encoding. So the host reads the head and body the
    proxy read, never a later request as a body or a body as a request."""
    lines = head.removesuffix(b"\r\n\r\n").split(b"\r\n")
    if any(b"\r" in line or b"\n" in line for line in lines):
        raise BadRequest("a bare CR or LF in the request head (each line must end with CRLF)")
    if not (request_line := REQUEST_LINE.fullmatch(lines[0])):
        raise BadRequest("a request line that is not METHOD TARGET HTTP/1.x")
    method, target = request_line.groups()
    fields: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, value = field_line(line)
        fields.setdefault(name, []).append(value)
    for name in (b"content-length", b"transfer-encoding", b"host"):
        if len(fields.get(name, [])) > 1:
            raise BadRequest(f"more than one {name.decode()} header")
    length, coding = (fields[name][0] if name in fields else None for name in (b"content-length", b"transfer-encoding"))
    if length is not None and coding is not None:
        raise BadRequest("both content-length and transfer-encoding")
    if length is not None and not length.isdigit():
        raise BadRequest("a content-length that is not a number")
    codings = [c.strip(b" \t").lower() for c in coding.split(b",")] if coding is not None else []
    if codings and (codings[-1] != b"chunked" or codings.count(b"chunked") > 1):
        raise BadRequest("a transfer-encoding that does not end with one chunked")
    hosts = {_host(value) for value in fields.get(b"host", [])}
    if method == b"CONNECT":
        hosts.add(_host(target))
    elif not target.startswith(b"/") and target != b"*":
        _, separator, rest = target.partition(b"://")
        if not separator:
            raise BadRequest("a request target that is neither a path nor an absolute URL")
        hosts.add(_host(re.split(rb"[/?#]", rest, maxsplit=1)[0]))
    raw = method == b"CONNECT" or b"upgrade" in fields  # the rest of the connection is another protocol's
    body: int | str = "raw" if raw else "chunked" if codings else int(length or 0)
    return Request(body, frozenset(hosts))


FRAMING = {b"content-length", b"transfer-encoding", b"host"}


def field_line(line: bytes) -> tuple[bytes, bytes]:
    """A header (or trailer) line without its CRLF, as (lower-cased name, value); BadRequest if it is not one."""
    if b"\r" in line or b"\n" in line or b"\0" in line:
        raise BadRequest("a bare CR or LF, or a NUL, in a header line (each line must end with CRLF)")
    if any((byte < 0x20 and byte != 0x09) or byte == 0x7F for byte in line):
        raise BadRequest("a control character in a header line")
    if line[:1] in (b" ", b"\t"):
        raise BadRequest("a folded header line (obs-fold)")
    name, colon, value = line.partition(b":")
    if not colon or not FIELD_NAME.fullmatch(name):
        raise BadRequest("a header line that is not NAME: VALUE")
    if name.lower() not in FRAMING and name.lower().replace(b"_", b"-") in FRAMING:
        raise BadRequest(f"a header {name.decode()!r} that some servers read as {name.decode().replace('_', '-')!r}")
    return name.lower(), value.strip(b" \t")


def chunk_size(line: bytes) -> int:
    """The size in a chunk's size line (with its CRLF); BadRequest unless it is only hex digits and extensions."""
    if not (match := CHUNK_SIZE.fullmatch(line)):
        raise BadRequest("a chunk size line that is not hex digits (and extensions) ending with CRLF")
    return int(match.group(1), 16)


def _host(authority: bytes) -> str:
    """The host of ``host[:port]``, lower-cased, without a trailing dot."""
    match = AUTHORITY.fullmatch(authority.decode("ascii", "replace").lower())
    if not match or not (name := match.group(1).rstrip(".")):
        raise BadRequest("a host that is not a name or an address (with a port)")
    return name
