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
    if PROFILE_DIR is not None:
        phase = {"test": report.nodeid, "when": report.when, "outcome": report.outcome}
        _write({"kind": "phase", **phase, "seconds": round(report.duration, 4)})
