"""The agent's output buffers: the last N bytes of a stream, addressed by absolute offsets."""

from __future__ import annotations

import pytest

from stasis.guest.processes import OutputBuffer

pytestmark = pytest.mark.fast


def test_within_the_limit_everything_is_kept() -> None:
    buffer = OutputBuffer(10)
    buffer.append(b"hello")
    assert buffer.read(0, 100) == (b"hello", 0, 0)
    assert buffer.end == 5


def test_overflow_drops_the_oldest_bytes_and_moves_the_start() -> None:
    buffer = OutputBuffer(4)
    buffer.append(b"abcdef")
    assert (buffer.start, buffer.end, bytes(buffer.data)) == (2, 6, b"cdef")


def test_a_reader_behind_the_start_is_told_how_much_it_lost() -> None:
    buffer = OutputBuffer(4)
    buffer.append(b"abcdef")
    assert buffer.read(0, 100) == (b"cdef", 2, 2)


def test_offsets_are_absolute_across_appends() -> None:
    buffer = OutputBuffer(100)
    buffer.append(b"abc")
    data, served, _ = buffer.read(0, 2)
    buffer.append(b"def")
    assert (data, served) == (b"ab", 0)
    assert buffer.read(served + len(data), 100) == (b"cdef", 2, 0)
    assert buffer.read(6, 100) == (b"", 6, 0)
    assert buffer.read(-5, 1) == (b"a", 0, 0)
