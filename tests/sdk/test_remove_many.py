"""Many sandboxes removed in one call (a rollout's forks): each one named goes, and one that cannot be is said
without keeping the rest."""

from __future__ import annotations

import pytest

from stasis import Client, Sandbox, StasisError


def test_terminate_all_removes_every_sandbox_named_in_one_call(client: Client) -> None:
    parent = Sandbox.create(memory_mb=256, client=client)
    children = parent.copy(times=3)
    try:
        removed = Sandbox.terminate_all([*children, parent.id])
        assert sorted(removed) == sorted([c.id for c in children] + [parent.id])
        assert {s.id for s in Sandbox.list(client=client)}.isdisjoint(removed)
        assert Sandbox.terminate_all([], client=client) == []
    finally:
        for sbx in [*children, parent]:
            if sbx.info().status.value != "terminated":
                sbx.terminate()


def test_a_sandbox_that_cannot_be_removed_is_said_and_the_others_still_go(client: Client) -> None:
    kept = Sandbox.create(memory_mb=256, client=client)
    with pytest.raises(StasisError, match=r"1 of 2 not removed \(no-such-sandbox-x: ") as refused:
        Sandbox.terminate_all([kept, "no-such-sandbox-x"])
    assert refused.value.details["removed"] == [kept.id] and list(refused.value.details["failed"]) == [
        "no-such-sandbox-x"
    ]
    assert kept.info().status.value == "terminated"
