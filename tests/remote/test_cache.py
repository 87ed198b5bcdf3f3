"""The local cache of fetched pieces: bounded, least recently used out first; what `stasis df` counts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from stasis.remote.cache import ChunkCache

pytestmark = pytest.mark.fast

PIECE = 100_000


def test_past_its_limit_the_least_recently_used_pieces_go_first(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path, limit_bytes=5 * PIECE)
    for index in range(5):
        cache.put(f"{index:064x}", bytes([index]) * PIECE)
        past = time.time() - 100 + index  # put in order, a second apart
        os.utime(tmp_path / f"{index:064x}"[:2] / f"{index:064x}", (past, past))
    assert cache.get(f"{0:064x}") == bytes([0]) * PIECE  # read now: the most recently used
    cache.put(f"{5:064x}", bytes([5]) * PIECE)  # one over the limit
    size, count = cache.usage()
    assert size <= 5 * PIECE and count == 4  # down to 90% of the limit: two went
    assert cache.get(f"{0:064x}") is not None and cache.get(f"{5:064x}") is not None
    assert cache.get(f"{1:064x}") is None and cache.get(f"{2:064x}") is None  # the oldest unread ones


def test_a_zero_limit_caches_nothing(tmp_path: Path) -> None:
    cache = ChunkCache(tmp_path, limit_bytes=0)
    cache.put("ab" * 32, b"x" * PIECE)
    assert cache.get("ab" * 32) is None and cache.usage() == (0, 0)
