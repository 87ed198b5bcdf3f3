"""What each sandbox's processes actually burnt: CPU seconds on the host, and bytes through its egress proxy.

Counters are read from the host (:func:`.host_usage.cpu_reading`, the core's ``traffic``) every
``STASIS_METER_SECONDS`` (default 15) for each running sandbox, when usage is asked for, and once more just before
its processes stop (a suspend, a removal, a death), so a run's last seconds are never lost to the gap between two
readings. A reading adds what grew since the last one. A CPU counter starts again at zero with each run of the
sandbox on the host, so the reading taken as a run stops is its last, and the next run is counted from zero.
Egress counters belong to their proxy (a new one after a daemon restart starts at zero): a reading of another
proxy than the last adds all of its count.

What grew is added to its minute in ``meter.db`` (WAL, ``synchronous=FULL``: a daemon killed at any moment keeps
every reading it took). A sandbox left running across the kill goes on counting in the same cgroup, so the next
reading adds what it burnt meanwhile; only egress bytes that crossed the proxy after the last reading go with the
killed daemon (its proxy is the daemon's). Not counted: bytes of HTTPS calls the secrets' broker makes for a
sandbox, and DNS queries. A run that a failed suspend leaves running is counted again from zero (rare: a suspend
fails only when the host's disk is full or runsc breaks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import threading
import time
from pathlib import Path

from ...models import SandboxStatus
from ..core.service import SandboxService
from .host_usage import cpu_reading

log = logging.getLogger(__name__)

COUNTERS = ("cpu_seconds", "egress_bytes", "ingress_bytes")
BUCKET_SECONDS = 60  # what grew is kept per minute: a window is exact to the minute
SCHEMA = """
CREATE TABLE IF NOT EXISTS meter_last (
    sandbox_id TEXT NOT NULL,
    counter TEXT NOT NULL,
    run TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (sandbox_id, counter)
);
CREATE TABLE IF NOT EXISTS meter_minutes (
    sandbox_id TEXT NOT NULL,
    counter TEXT NOT NULL,
    minute INTEGER NOT NULL,
    amount REAL NOT NULL,
    PRIMARY KEY (sandbox_id, counter, minute)
);
"""

Reading = tuple[str, str, float]  # (counter, run, value so far)
CPU_RUN = "host"  # a CPU counter's runs are told apart by the stop between them (:meth:`Meter.stopping`)


def interval_from_env() -> float:
    return max(1.0, float(os.environ.get("STASIS_METER_SECONDS", "15")))


class Meter:
    def __init__(self, path: Path, core: SandboxService) -> None:
        self.core = core
        self.interval = interval_from_env()
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        self._lock = threading.RLock()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ readings

    def readings(self, sandbox_id: str) -> list[Reading]:
        found: list[Reading] = []
        if (cpu := cpu_reading(sandbox_id)) is not None:
            found.append(("cpu_seconds", CPU_RUN, cpu))
        if (traffic := self.core.traffic(sandbox_id)) is not None:
            run, sent, received = traffic
            found += [("egress_bytes", run, float(sent)), ("ingress_bytes", run, float(received))]
        return found

    def sample(self, sandbox_id: str) -> None:
        """Read the sandbox's counters now and keep what grew."""
        self._take(sandbox_id, stopping=False)

    def stopping(self, sandbox_id: str) -> None:
        """The last reading of a run (a hook: just before the sandbox's processes stop); its next starts at zero."""
        self._take(sandbox_id, stopping=True)

    def _take(self, sandbox_id: str, stopping: bool) -> None:
        try:
            with self._lock:  # read and kept in one step: two readings never cross
                self.record(sandbox_id, self.readings(sandbox_id), time.time())
                if stopping:
                    self.db.execute("UPDATE meter_last SET value = 0 WHERE sandbox_id = ? AND counter = ?",
                                    (sandbox_id, "cpu_seconds"))  # fmt: skip
        except Exception:
            log.exception("could not meter sandbox %s", sandbox_id)

    def record(self, sandbox_id: str, readings: list[Reading], at: float) -> None:
        minute = int(at // BUCKET_SECONDS) * BUCKET_SECONDS
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for counter, run, value in readings:
                    last = self.db.execute("SELECT run, value FROM meter_last WHERE sandbox_id = ? AND counter = ?",
                                           (sandbox_id, counter)).fetchone()  # fmt: skip
                    grew = value if last is None or last[0] != run else value - last[1]
                    self.db.execute("INSERT OR REPLACE INTO meter_last (sandbox_id, counter, run, value) "
                                    "VALUES (?, ?, ?, ?)", (sandbox_id, counter, run, value))  # fmt: skip
                    if grew > 0:  # a process of the run that exited takes its share out of a sum: never negative
                        self.db.execute(
                            "INSERT INTO meter_minutes (sandbox_id, counter, minute, amount) VALUES (?, ?, ?, ?) "
                            "ON CONFLICT (sandbox_id, counter, minute) DO UPDATE SET amount = amount + excluded.amount",
                            (sandbox_id, counter, minute, grew),
                        )  # fmt: skip
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def totals(self, since: float) -> dict[str, dict[str, float]]:
        """Each sandbox's counters summed over the minutes from ``since``'s on."""
        first = int(since // BUCKET_SECONDS) * BUCKET_SECONDS
        query = "SELECT sandbox_id, counter, SUM(amount) FROM meter_minutes WHERE minute >= ? GROUP BY 1, 2"
        with self._lock:
            rows = self.db.execute(query, (first,)).fetchall()
        found: dict[str, dict[str, float]] = {}
        for sandbox_id, counter, amount in rows:
            found.setdefault(sandbox_id, {})[counter] = amount
        return found

    # ------------------------------------------------------------ the periodic reading

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="meter")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                running = [info.id for info in self.core.records(status=SandboxStatus.RUNNING)]
                for sandbox_id in running:
                    await asyncio.to_thread(self.sample, sandbox_id)
            except Exception:  # one bad round never ends metering
                log.exception("metering round failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for info in self.core.records(status=SandboxStatus.RUNNING):
            self.sample(info.id)  # a daemon that stops keeps what its sandboxes burnt until now
        self.db.close()
