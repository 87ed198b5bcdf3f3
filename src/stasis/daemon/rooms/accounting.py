"""Usage per sandbox and per team, read from the transitions journal: every status change is there, written
with ``synchronous=FULL`` in the change's own transaction, so a daemon killed at any moment loses no accounted
second (a sandbox that went on running across the kill is still running in the journal, and is counted to now).

Counted are allocations over time: a sandbox's CPUs and memory over the seconds it was up (starting, running,
checkpointing, suspending), its disk over the time it existed (suspended too), and the checkpoints kept now
over the time they have been kept. What a sandbox's processes actually burnt is not counted here.
"""

from __future__ import annotations

import time
from typing import Any

from ...models import SandboxInfo, SandboxStatus
from ...team_models import SandboxUsage, TeamUsage, UsageReport
from ..core.service import SandboxService
from .checkpointing import Checkpoints

S = SandboxStatus
UP = {S.PENDING.value, S.RUNNING.value, S.SNAPSHOTTING.value, S.SUSPENDING.value, S.RESUMING.value}
DOWN = {S.SUSPENDED.value}


def sandbox_usage(info: SandboxInfo, journal: list[dict[str, Any]], since: float, until: float) -> SandboxUsage:
    """One sandbox's usage within [since, until]: each interval between two of its transitions, clipped."""
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
        cpu_seconds=up * spec.cpus, memory_gib_seconds=up * spec.memory_mb / 1024,
        disk_gib_hours=(up + down) * spec.disk_mb / 1024 / 3600,
    )  # fmt: skip


def usage(
    core: SandboxService, checkpoints: Checkpoints, since: float, team: str | None = None, only_team: bool = False
) -> UsageReport:
    """Every sandbox's usage since ``since`` and each team's sum (``only_team``: ``team``'s alone)."""
    until = time.time()
    rows = []
    for info in core.list(include_terminated=True):
        if only_team and info.spec.team != team:
            continue
        if info.status == S.TERMINATED and info.updated_at < since:
            continue  # over before the window
        rows.append(sandbox_usage(info, core.journal(info.id), since, until))
    by_team: dict[str | None, TeamUsage] = {}
    fields = ("running_seconds", "suspended_seconds", "cpu_seconds", "memory_gib_seconds", "disk_gib_hours")
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
