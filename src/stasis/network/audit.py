"""The egress audit: every connection a sandbox opens, allowed or denied, as one JSON line.

    {"time": 1733..., "sandbox": "sb-...", "destination": "10.1.2.3", "port": 443, "name": "api.example.com",
     "verdict": "allowed", "rule": "allow_out api.example.com", "bytes_out": 517, "bytes_in": 4120, "seconds": 0.21}

``name`` is what the connection claimed (TLS SNI, HTTP Host) or, failing that, the names the sandbox's resolver
gave for the address. An allowed connection is written when it ends (with its bytes each way), a denied one at
once. Kept beside the sandbox (``egress.jsonl``), rotated at ``ROTATE_BYTES`` into one older file, so a sandbox
holds at most twice that; it goes when the sandbox goes. What a sandbox sends is untrusted: the names in a line
are its claims, said as such, and a line is JSON-escaped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROTATE_BYTES = 4 << 20
NAME = "egress.jsonl"


class EgressAudit:
    def __init__(self, directory: Callable[[str], Path]) -> None:
        self.directory = directory  # the sandbox's own directory

    def path(self, sandbox_id: str) -> Path:
        return self.directory(sandbox_id) / NAME

    def record(self, sandbox_id: str, entry: dict[str, Any]) -> None:
        """Append one line; a sandbox whose directory is gone (removed meanwhile) has nothing to keep it."""
        path = self.path(sandbox_id)
        line = (json.dumps({"sandbox": sandbox_id, **entry}, sort_keys=True) + "\n").encode()
        try:
            if path.exists() and path.stat().st_size + len(line) > ROTATE_BYTES:
                os.replace(path, path.with_name(NAME + ".1"))
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("egress audit of %s: cannot write %s: %s", sandbox_id, path, exc)

    def lines(self, sandbox_id: str) -> Iterator[dict[str, Any]]:
        """Every kept line, oldest first."""
        for path in (self.path(sandbox_id).with_name(NAME + ".1"), self.path(sandbox_id)):
            yield from read_lines(path, 0)[0]


def read_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The whole lines of ``path`` from byte ``offset``, and the offset after the last of them."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    return [json.loads(raw) for raw in whole.splitlines() if raw.strip()], offset + len(whole)
