"""The guest protocol as data: every operation named once, round-trips, and errors mapped."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from stasis import errors
from stasis.guest import protocol as P
from stasis.guest.client import GUEST_ERRORS, error_from_guest

pytestmark = pytest.mark.fast


def test_every_operation_is_in_the_table_once() -> None:
    defined = [
        c for _, c in inspect.getmembers(P, inspect.isclass) if issubclass(c, P.Operation) and c is not P.Operation
    ]
    assert sorted(c.__name__ for c in defined) == sorted(c.__name__ for c in P.OPERATIONS.values())
    assert len({c.op for c in defined}) == len(defined)
    for op in defined:
        assert dataclasses.is_dataclass(op.result), op


def test_the_agent_has_a_handler_for_every_operation() -> None:
    from stasis.guest.agent import Agent

    reader, writer = os.pipe()
    try:
        agent = Agent(reader, writer)
        assert set(agent.handlers) == set(P.OPERATIONS.values())
    finally:
        os.close(reader)
        os.close(writer)


def test_an_agent_that_does_not_serve_reaps_nothing() -> None:
    """Only a serving agent reaps every child: an Agent built elsewhere (a test, a tool) must not
    steal its process's exit statuses. In a fresh process: pytest's may run the daemon's reaper."""
    script = textwrap.dedent("""
        import os, subprocess, time
        from stasis.guest.agent import Agent
        Agent(*os.pipe())
        child = subprocess.Popen(["sh", "-c", "sleep 1; exit 3"])
        time.sleep(1.5)  # a reaper would be blocked in waitpid when the child exits
        assert child.wait() == 3
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_requests_leave_none_out_and_results_keep_it() -> None:
    assert P.encode(P.Exec(cmd=["true"])) == {"cmd": ["true"], "env": {}, "stdin": False}
    state = P.ProcessState("p-1", 7, None, ["sh"], "running", None, 1.0, None, 0, 0)
    assert P.encode(state, keep_none=True)["exit_code"] is None
    assert P.decode(P.ProcessState, P.encode(state, keep_none=True)) == state


def test_nested_results_decode_and_unknown_keys_are_ignored() -> None:
    chunk = {"data": "", "offset": 0, "next_offset": 3, "lost": 0, "eof": True, "from_the_future": 1}
    streams = P.decode(P.ProcessStreams, {"exit_code": 0, "timed_out": False, "stdout": chunk, "stderr": chunk})
    assert streams.stdout == P.StreamChunk("", 0, 3, 0, True)
    listing = P.decode(P.DirListing, {"path": "/", "entries": [{"name": "a", "path": "/a", "type": "file",
                                                                "size": 1, "mode": 420, "mtime": 0.0}]})  # fmt: skip
    assert listing.entries[0].name == "a"


def test_a_reply_missing_a_required_field_is_an_error() -> None:
    with pytest.raises(TypeError):
        P.decode(P.HealthInfo, {"version": 2})


def test_every_error_kind_maps_to_an_actionable_class() -> None:
    kinds = {v for k, v in vars(P.ErrorKind).items() if k.isupper()}
    assert kinds == set(GUEST_ERRORS)
    assert isinstance(error_from_guest({"type": P.ErrorKind.FILE_NOT_FOUND, "message": "x"}), FileNotFoundError)
    assert isinstance(error_from_guest({"type": P.ErrorKind.UNKNOWN_OPERATION}), errors.Unsupported)
    no_space = error_from_guest({"type": P.ErrorKind.NO_SPACE, "message": "No space left on device"})
    assert isinstance(no_space, errors.NoSpace) and "disk_mb" in str(no_space)
    assert type(error_from_guest({"type": "SomethingNew"})) is errors.GuestError
