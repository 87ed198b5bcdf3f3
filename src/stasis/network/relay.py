"""Copy bytes both ways between two TCP streams until both sides are done; or run both directions of a bridge
until either ends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable, Coroutine
from typing import Any

CHUNK = 256 * 1024
HALF_CLOSED_IDLE = 60.0  # seconds a connection with one side ended may stay silent before both are reset


async def pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    on_data: Callable[[], None],
    counted: Callable[[int], None] = lambda size: None,
) -> int:
    """Copy one direction to its end, then half-close the other side; a broken side is reset. The bytes copied
    (each chunk also told to ``counted`` as it goes: a connection open for days is counted while it lasts)."""
    copied = 0
    try:
        while data := await reader.read(CHUNK):
            on_data()
            writer.write(data)
            copied += len(data)
            counted(len(data))
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # a half-close goes through: the other side may still answer
    except (ConnectionError, OSError):
        abort(writer)
    return copied


async def relay(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    on_data: Callable[[], None] = lambda: None,
    counted: tuple[Callable[[int], None], Callable[[int], None]] = (lambda size: None, lambda size: None),
    half_closed_idle: float = HALF_CLOSED_IDLE,
) -> tuple[int, int]:
    """The bytes copied from a to b, and from b to a (``counted``: told of each chunk, forth and back).

    Once one side has ended, the other may go on answering for as long as it sends; silent for
    ``half_closed_idle`` seconds, both are reset (a remote that never closes would hold the connection, and its
    two descriptors, forever)."""
    copied, last = [0, 0], [time.monotonic()]

    def seen(direction: int, tell: Callable[[int], None]) -> Callable[[int], None]:
        def count(size: int) -> None:
            copied[direction] += size
            last[0] = time.monotonic()
            tell(size)

        return count

    directions = [
        asyncio.ensure_future(pipe(a[0], b[1], on_data, seen(0, counted[0]))),
        asyncio.ensure_future(pipe(b[0], a[1], on_data, seen(1, counted[1]))),
    ]
    try:
        _, going = await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
        last[0] = time.monotonic()
        while going:
            left = last[0] + half_closed_idle - time.monotonic()
            if left <= 0:
                for _, writer in (a, b):
                    abort(writer)
                break
            _, going = await asyncio.wait(going, timeout=left)
        for direction in directions:  # what pipe does not handle (a counter that failed) is not lost here
            if direction.done() and not direction.cancelled() and (failed := direction.exception()) is not None:
                raise failed
        return copied[0], copied[1]
    finally:
        for direction in directions:
            direction.cancel()
        await asyncio.gather(*directions, return_exceptions=True)
        for _, writer in (a, b):
            writer.close()


def abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset: the other side sees "connection reset", not a clean end."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def until_first_done(*directions: Coroutine[Any, Any, None]) -> list[BaseException | None]:
    """Run each direction of a bridge (a WebSocket's two ways) until one ends; the others are cancelled and
    awaited. What each ended with: None, or the exception it raised (a cancelled one: CancelledError)."""
    tasks = [asyncio.ensure_future(direction) for direction in directions]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        ended = await asyncio.gather(*tasks, return_exceptions=True)
    return [outcome if isinstance(outcome, BaseException) else None for outcome in ended]
