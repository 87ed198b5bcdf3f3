"""The sandbox list as the console shows it, and its live feed (what the page's EventSource reads)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from ....models import SandboxInfo, SandboxStatus
from ...core.service import SandboxService
from ...rooms.host_usage import host_usage
from ...rooms.ports import Ports

TICK_SECS = 1.0  # how often the feed looks; the page only listens


def describe(
    info: SandboxInfo, usage: tuple[float | None, float] | None, ports: list[int] | None = None
) -> dict[str, Any]:
    cpu, memory = usage or (None, None)
    policy = info.spec.network
    return {
        "id": info.id,
        "name": info.name or info.id,
        "status": info.status.value,
        "backend": info.spec.backend,
        "team": info.spec.team,
        "image": info.spec.image,
        "cpus": info.spec.cpus,
        "memory_mb": info.spec.memory_mb,
        "cpu_percent": None if cpu is None else round(cpu, 1),
        "memory_used_mib": None if memory is None else round(memory, 1),
        "idle_secs": int(time.time() - info.last_activity),
        "idle_action": info.idle_action,
        "idle_action_in": None if info.idle_action_at is None else int(info.idle_action_at - time.time()),
        "network": policy.describe() if policy is not None else "none",
        "ports": ports or [],
        "from_checkpoint": info.from_checkpoint,
        "forked_from": info.forked_from,
        "error": info.error,
    }


class Feed:
    def __init__(self, service: SandboxService, ports: Ports) -> None:
        self.service = service
        self.ports = ports
        self._cpu: dict[str, tuple[float, float]] = {}  # id -> (CPU seconds, when) at the last look
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Look again now (an action just changed something)."""
        self._changed.set()

    def snapshot(self, usage: dict[str, tuple[float | None, float]] | None = None) -> list[dict[str, Any]]:
        """Every sandbox (read in the event loop: the store is the loop's), with ``usage`` by id."""
        ports = self.ports.exposed()
        return [describe(info, (usage or {}).get(info.id), ports.get(info.id)) for info in self.service.list()]

    def _usage(self, running: list[str]) -> dict[str, tuple[float | None, float]]:
        """CPU (percent since the last look) and memory of each running sandbox: reads /proc, in a thread."""
        found: dict[str, tuple[float | None, float]] = {}
        for sandbox_id in running:
            cpu, memory = host_usage(sandbox_id)
            now = time.monotonic()
            last = self._cpu.get(sandbox_id)
            self._cpu[sandbox_id] = (cpu, now)
            found[sandbox_id] = (None if last is None else 100 * (cpu - last[0]) / max(now - last[1], 1e-6), memory)
        return found

    async def follow(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The list now, then each time it changes (looked at every second, or at once after an action)."""
        last: list[dict[str, Any]] | None = None
        while True:
            running = [i.id for i in self.service.list() if i.status == SandboxStatus.RUNNING]
            rows = self.snapshot(await asyncio.to_thread(self._usage, running))
            if rows != last:
                yield rows
                last = rows
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), TICK_SECS)
