"""Where the suite's time goes: with STASIS_TEST_PROFILE=DIR, every worker writes one JSON-lines file there,
a line per test phase (setup, call, teardown) and per fixture set-up, for `scripts/test_profile.py` to sum.

Nothing is recorded without the variable: the hooks then cost a dictionary look-up per test."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

PROFILE_DIR = os.environ.get("STASIS_TEST_PROFILE")
_out: IO[str] | None = None


def _write(record: dict[str, object]) -> None:
    global _out
    if PROFILE_DIR is None:
        return
    if _out is None:
        Path(PROFILE_DIR).mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _out = open(Path(PROFILE_DIR) / f"{worker}-{os.getpid()}.jsonl", "a")  # noqa: SIM115 - open for the run
    _out.write(json.dumps(record) + "\n")
    _out.flush()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    if PROFILE_DIR is not None:
        seconds = round(time.monotonic() - started, 4)
        _write(
            {
                "kind": "fixture",
                "name": fixturedef.argname,
                "scope": fixturedef.scope,
                "test": request.node.nodeid,
                "seconds": seconds,
            }
        )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if PROFILE_DIR is not None and getattr(report, "node", None) is None:  # xdist's controller: a worker's, again
        phase = {"test": report.nodeid, "when": report.when, "outcome": report.outcome}
        _write({"kind": "phase", **phase, "seconds": round(report.duration, 4)})


# The slowest files first (longest processing time first): with `--dist loadfile` each file runs whole on one
# worker, so a long file started last would run on alone while the other worker idles. The costs are a profile's
# (`scripts/test_profile.py DIR --durations tests/durations.json`); a file it does not name counts as a median one.
# A stale list costs only balance, never correctness.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        known: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    costs = sorted(known.values())
    median = costs[len(costs) // 2] if costs else 0.0
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(_file_of(item), index)

    def slowest_first(item: pytest.Item) -> tuple[float, int]:
        path = _file_of(item)
        return -known.get(path, median), first_seen[path]

    items.sort(key=slowest_first)


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]
