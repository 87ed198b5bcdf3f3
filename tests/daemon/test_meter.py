"""The meter's arithmetic on its own SQLite file: what a reading adds, per run and per minute, kept across a
reopen. (What it reads off a real sandbox is tested in test_teams.py and tests/network/test_egress.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from stasis.daemon.rooms.meter import BUCKET_SECONDS, Meter

pytestmark = pytest.mark.fast
T0 = 1_800_000_000.0  # a minute's start


def test_a_run_adds_what_grew_a_new_run_all_of_its_count_and_nothing_is_ever_negative(tmp_path: Path) -> None:
    meter = Meter(tmp_path / "meter.db", core=None)  # type: ignore[arg-type]  # record and totals need no core
    meter.record("sb-a", [("cpu_seconds", "run-1", 2.0)], T0)
    meter.record("sb-a", [("cpu_seconds", "run-1", 5.0)], T0 + 10)  # +3
    meter.record("sb-a", [("cpu_seconds", "run-1", 4.0)], T0 + 20)  # a process of the run exited: +0
    meter.record("sb-a", [("cpu_seconds", "run-1", 4.5)], T0 + 30)  # +0.5 from where it stands now
    meter.record("sb-a", [("cpu_seconds", "run-2", 1.0)], T0 + BUCKET_SECONDS)  # resumed: a new run, +1
    meter.record("sb-b", [("egress_bytes", "proxy-1", 100.0), ("ingress_bytes", "proxy-1", 900.0)], T0)
    assert meter.totals(T0) == {"sb-a": {"cpu_seconds": 6.5},
                                "sb-b": {"egress_bytes": 100.0, "ingress_bytes": 900.0}}  # fmt: skip
    assert meter.totals(T0 + BUCKET_SECONDS) == {"sb-a": {"cpu_seconds": 1.0}}  # a window from the next minute
    meter.db.close()
    reopened = Meter(tmp_path / "meter.db", core=None)  # type: ignore[arg-type]
    reopened.record("sb-a", [("cpu_seconds", "run-2", 1.25)], T0 + BUCKET_SECONDS + 5)  # the same run goes on
    assert reopened.totals(T0)["sb-a"] == {"cpu_seconds": 6.75}
    reopened.db.close()
