"""Where a new sandbox goes: the best of K nodes drawn at random (power of K choices, as E2B places), by the
room left on each: the smaller of its free CPU and free memory shares, then the fewer sandboxes."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ..errors import DaemonUnavailable, InvalidRequest

K = 2


def room_left(node: dict[str, Any]) -> tuple[float, int]:
    cpu = node["free_cpus"] / node["cpus"] if node["cpus"] else 0.0
    memory = node["free_memory_mb"] / node["memory_mb"] if node["memory_mb"] else 0.0
    return min(cpu, memory), -node["sandboxes"]


def place(nodes: Sequence[dict[str, Any]], wanted: str | None = None, k: int = K) -> dict[str, Any]:
    """The node a create goes to: ``wanted`` by name, else the roomiest of ``k`` drawn at random."""
    up = [n for n in nodes if n["state"] == "up"]
    if wanted is not None:
        for node in up:
            if node["name"] == wanted:
                return node
        names = ", ".join(sorted(n["name"] for n in up)) or "none"
        raise InvalidRequest(f"no live node named {wanted[:80]!r} in the fleet (live nodes: {names}); "
                             "`stasis fleet nodes` lists them")  # fmt: skip
    if not up:
        raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
    drawn = random.sample(up, min(k, len(up)))
    return max(drawn, key=room_left)
