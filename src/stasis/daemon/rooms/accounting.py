"""Usage per sandbox and per team, read from the transitions journal: every status change is there, written
with ``synchronous=FULL`` in the change's own transaction, so a daemon killed at any moment loses no accounted
second (a sandbox that went on running across the kill is still running in the journal, and is counted to now).

Counted are allocations over time: a sandbox's CPUs and memory over the seconds it was up (starting, running,
checkpointing, suspending), its disk over the time it existed (suspended too), and the checkpoints kept now
over the time they have been kept; and what its processes actually burnt, as the meter (:mod:`.meter`) read it:
CPU seconds on the host, bytes through its egress proxy.
"""

from __future__ import annotations

import time
from typing import Any

from ...models import SandboxInfo, SandboxStatus
from ...team_models import SandboxUsage, TeamUsage, UsageReport
from ..core.service import SandboxService
from .checkpointing import Checkpoints
from .meter import Meter

S = SandboxStatus
UP = {S.PENDING.value, S.RUNNING.value, S.SNAPSHOTTING.value, S.SUSPENDING.value, S.RESUMING.value}
DOWN = {S.SUSPENDED.value}


def sandbox_usage(
    info: SandboxInfo, journal: list[dict[str, Any]], since: float, until: float, metered: dict[str, float]
) -> SandboxUsage:
    """One sandbox's usage within [since, until]: each interval between two of its transitions, clipped; and what
    the meter read of it (``metered``)."""
    up = down = 0.0
    for index, entry in enumerate(journal):
        start = entry["at"]
        end = journal[index + 1]["at"] if index + 1 < len(journal) else until
        seconds = max(0.0, min(end, until) - max(start, since))
        if entry["to_status"] in UP:
            up += seconds
        elif entry["to_status"] in DOWN:
            down += seconds
    spec = info.spec
    return SandboxUsage(
        sandbox_id=info.id, name=info.name, team=spec.team, running_seconds=up, suspended_seconds=down,
        cpu_seconds=metered.get("cpu_seconds", 0.0), cpu_allocated_seconds=up * spec.cpus,
        memory_gib_seconds=up * spec.memory_mb / 1024, disk_gib_hours=(up + down) * spec.disk_mb / 1024 / 3600,
        egress_bytes=int(metered.get("egress_bytes", 0)), ingress_bytes=int(metered.get("ingress_bytes", 0)),
    )  # fmt: skip


def usage(
    core: SandboxService, checkpoints: Checkpoints, meter: Meter, since: float, team: str | None = None,
    only_team: bool = False,
) -> UsageReport:  # fmt: skip
    """Every sandbox's usage since ``since`` and each team's sum (``only_team``: ``team``'s alone)."""
    infos = [i for i in core.list(include_terminated=True) if not only_team or i.spec.team == team]
    for info in infos:
        if info.status == S.RUNNING:
            meter.sample(info.id)  # counted to now, not to the meter's last round
    until, metered = time.time(), meter.totals(since)
    rows = []
    for info in infos:
        if info.status == S.TERMINATED and info.updated_at < since:
            continue  # over before the window
        rows.append(sandbox_usage(info, core.journal(info.id), since, until, metered.get(info.id, {})))
    by_team: dict[str | None, TeamUsage] = {}
    fields = ("running_seconds", "suspended_seconds", "cpu_seconds", "cpu_allocated_seconds", "memory_gib_seconds",
              "disk_gib_hours", "egress_bytes", "ingress_bytes")  # fmt: skip
    for row in rows:
        total = by_team.setdefault(row.team, TeamUsage(team=row.team))
        total.sandboxes += 1
        for field in fields:
            setattr(total, field, getattr(total, field) + getattr(row, field))
    for checkpoint in checkpoints.list():
        owner = checkpoint.spec.team
        if only_team and owner != team:
            continue
        hours = max(0.0, until - max(checkpoint.created_at, since)) / 3600
        total = by_team.setdefault(owner, TeamUsage(team=owner))
        total.checkpoint_gib_hours += checkpoint.size_bytes / (1 << 30) * hours
    teams = sorted(by_team.values(), key=lambda t: t.team or "")
    return UsageReport(since=since, until=until, teams=teams, sandboxes=rows)
