"""Sandboxes that wait in the fleet's store (no node holds them), as the door lists them: a record from the store
is anyone's who could write the store, so only a sound one is listed."""

from __future__ import annotations

import math
from typing import Any

from ..validation import ID_PATTERN, NAME_PATTERN
from .nodes import Nodes


async def waiting_in_store(nodes: Nodes) -> list[dict[str, Any]]:
    """Sandboxes no node holds that wait in the fleet's store (gone there idle, or pushed): suspended, and any
    request brings one back on a live node."""
    live = await nodes.live()
    if not live:
        return []
    answer = await nodes.client(live[0]).get("/v1/remote")
    if not answer.is_success:  # no store: nothing waits anywhere
        return []
    return [{**entry["sandbox"], "status": "suspended", "node": None, "moved_to": "the fleet's store"}
            for entry in answer.json()
            if entry["kind"] == "sandbox" and entry.get("owner") is None and sound(entry)]  # fmt: skip


def sound(entry: dict[str, Any]) -> bool:
    """A record from the store (anyone who wrote the store could have written it) is listed only if it is the
    entry's own (same id and name), with an id, a name and times as the daemon makes them."""
    record = entry.get("sandbox")
    if not isinstance(record, dict) or record.get("id") != entry.get("id") or record.get("name") != entry.get("name"):
        return False
    name, times = record.get("name"), (record.get("created_at"), record.get("last_activity"))
    return (
        isinstance(record["id"], str) and bool(ID_PATTERN.fullmatch(record["id"]))
        and (name is None or bool(NAME_PATTERN.fullmatch(str(name))))
        and all(isinstance(t, int | float) and math.isfinite(t) for t in times)
    )  # fmt: skip
