"""A team's quotas over the whole fleet: checked by the door before a key's create or resume, with the team's
sandboxes on every node counted, and held until the node has answered (two of a team's creates never both pass
a limit between them). Each node still checks its own part; an automatic resume (a command to a suspended
sandbox) is checked there alone. The check fails closed: a node that does not answer the listing refuses it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from ..errors import DaemonUnavailable, QuotaExceeded
from ..models import TEMPLATE_PREFIX, CreateSandboxRequest
from .nodes import Nodes, checked
from .tenants import bearer, key_of

RUNNING = ("pending", "running", "snapshotting", "suspending", "resuming")
SIZES = ("cpus", "memory_mb", "disk_mb")
_checking: dict[str, asyncio.Lock] = {}  # per team: one start at a time is checked and made


@contextlib.asynccontextmanager
async def admitted(
    nodes: Nodes, request: Request, body: Any = None, resuming: str | None = None,
    forking: tuple[dict[str, Any], int] | None = None,
) -> AsyncIterator[None]:  # fmt: skip
    """Within: a key's create (``body``), resume (``resuming``: a name or id) or fork (``forking``: the checkpoint's
    spec and how many children) that its team's quotas allow."""
    key = key_of(request)
    if key is None:
        yield
        return
    team = request.state.team
    async with _checking.setdefault(team, asyncio.Lock()):
        await _check(nodes, key, team, body, resuming, forking)
        yield


async def _check(
    nodes: Nodes, key: str, team: str, body: Any, resuming: str | None, forking: tuple[dict[str, Any], int] | None
) -> None:
    live = await nodes.live()
    if not live:
        raise DaemonUnavailable("no live node in the fleet: `stasis fleet nodes` says what became of them")
    answer = await nodes.client(live[0]).get(f"/v1/teams/{checked(team)}")
    if not answer.is_success:
        raise DaemonUnavailable(f"team {team}'s quotas could not be read ({answer.status_code}); try again")
    quotas = answer.json()["quotas"]
    listings = await asyncio.gather(*(nodes.client(n).get("/v1/sandboxes", headers=bearer(key)) for n in live))
    if any(not listing.is_success for listing in listings):
        raise DaemonUnavailable("a node did not list the team's sandboxes, so its quotas cannot be counted; try again")
    theirs, count = [s for listing in listings for s in listing.json()], 1
    if forking is not None:
        wanted, count = {k: float(forking[0][k]) for k in SIZES}, forking[1]
    elif resuming is not None:
        target = next((s for s in theirs if resuming in (s["id"], s.get("name"))), None)
        if target is None or target["status"] in RUNNING:
            return  # not the key's (its node says so), or nothing to start
        wanted, theirs = {k: target["spec"][k] for k in SIZES}, [s for s in theirs if s is not target]
        wanted["disk_mb"] = 0  # it has its disk already
    else:
        found = await _wanted(nodes, key, body)
        if found is None:
            return  # not a create the node takes: it says why
        wanted = found
    running = [s["spec"] for s in theirs if s["status"] in RUNNING]
    disks = sum(s["spec"]["disk_mb"] for s in theirs if s["status"] not in ("terminating", "terminated"))
    checks = (
        ("running sandboxes", "max_running", len(running), count),
        ("CPUs", "max_cpus", sum(s["cpus"] for s in running), wanted["cpus"] * count),
        ("MiB of memory", "max_memory_mb", sum(s["memory_mb"] for s in running), wanted["memory_mb"] * count),
        ("MiB of disk", "max_disk_mb", disks, wanted["disk_mb"] * count),
    )
    for what, field, used, more in checks:
        limit = quotas.get(field)
        if limit is not None and used + more > limit:
            raise QuotaExceeded(
                f"team {team} has {used:g} {what} in use of its {limit:g} across the fleet, and this needs "
                f"{more:g} more; suspend or terminate one of its sandboxes, or raise the quota: "
                f"stasis team set {team} --{field.replace('_', '-')} N"
            )


async def _wanted(nodes: Nodes, key: str, body: Any) -> dict[str, float] | None:
    """The CPUs, memory and disk a create asks for, as its node will read them (its defaults, numbers sent as
    text; a restore's from its checkpoint unless the create says otherwise)."""
    try:
        asked = CreateSandboxRequest.model_validate(body)
    except ValidationError:
        return None
    wanted = {k: float(getattr(asked, k)) for k in SIZES}
    source = asked.snapshot_id or (f"{TEMPLATE_PREFIX}{asked.template}" if asked.template else None)
    if source is not None:
        with contextlib.suppress(Exception):  # not the key's, or gone: the node refuses the create itself
            holder = await nodes.holder("checkpoints", checked(source), bearer(key))
            checkpoint = (await nodes.client(holder).get(f"/v1/checkpoints/{source}", headers=bearer(key))).json()
            wanted |= {k: float(checkpoint["spec"][k]) for k in SIZES if k not in asked.model_fields_set}
    return wanted
