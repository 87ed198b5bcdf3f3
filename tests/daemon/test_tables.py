"""The state machine and the recovery table: data a broken row in would be caught by."""

from __future__ import annotations

import pytest

from stasis.backends.base import HostState
from stasis.daemon.core.recovery import RECOVERY, Plan
from stasis.daemon.core.states import INTENTS, TRANSITIONS, WHY_NOT, check_transition
from stasis.errors import StateError
from stasis.models import SandboxStatus as S

pytestmark = pytest.mark.fast


def test_every_state_has_its_transitions_and_a_reason() -> None:
    assert set(TRANSITIONS) == set(S) == set(WHY_NOT)
    assert TRANSITIONS[S.TERMINATED] == frozenset()


def test_every_state_is_reachable_from_pending_and_can_end() -> None:
    seen, frontier = {S.PENDING}, [S.PENDING]
    while frontier:
        for target in TRANSITIONS[frontier.pop()]:
            if target not in seen:
                seen.add(target)
                frontier.append(target)
    assert seen == set(S)
    for state in set(S) - {S.TERMINATED}:
        reach, frontier = {state}, [state]
        while frontier:
            for target in TRANSITIONS[frontier.pop()] - reach:
                reach.add(target)
                frontier.append(target)
        assert S.TERMINATED in reach, state


def test_intents_are_the_states_of_work_under_way() -> None:
    assert {S.PENDING, S.SUSPENDING, S.RESUMING, S.SNAPSHOTTING, S.TERMINATING} == INTENTS
    for intent in INTENTS - {S.TERMINATING}:
        assert S.FAILED in TRANSITIONS[intent] or intent == S.PENDING, intent


def test_an_illegal_transition_says_where_it_is_and_what_would_be_allowed() -> None:
    with pytest.raises(StateError) as caught:
        check_transition("sb-x", S.SUSPENDED, S.SNAPSHOTTING)
    assert caught.value.details["status"] == "suspended"
    assert caught.value.details["required"] == ["running"]
    check_transition("sb-x", S.RUNNING, S.SNAPSHOTTING)


def test_every_stored_state_and_host_state_has_a_recovery_row() -> None:
    assert set(RECOVERY) == {(s, h) for s in S for h in HostState}


# Where each plan leaves a sandbox that was in ``status``: the states it moves through must be legal.
OUTCOME = {
    Plan.DISCARD: [S.TERMINATING, S.TERMINATED],
    Plan.TERMINATE: [S.TERMINATED],
    Plan.ADOPT: [S.RUNNING],
    Plan.SALVAGE: [S.RUNNING],
    Plan.COMPLETE_SUSPEND: [S.SUSPENDED],
    Plan.BACK_TO_SUSPENDED: [S.SUSPENDED],
    Plan.KEEP_SUSPENDED: [],
    Plan.FAIL: [S.FAILED],
    Plan.STOP: [],
}


@pytest.mark.parametrize(("status", "host"), sorted(RECOVERY, key=lambda k: (k[0].value, k[1].value)))
def test_every_recovery_row_ends_in_a_settled_state_by_legal_steps(status: S, host: HostState) -> None:
    plan, detail = RECOVERY[(status, host)]
    assert detail
    path = list(OUTCOME[plan])
    if plan is Plan.COMPLETE_SUSPEND and status == S.RUNNING:
        path = [S.SUSPENDING, *path]
    current = status
    for target in path:
        if target != current:
            assert target in TRANSITIONS[current], f"{plan.name}: {current} → {target}"
            current = target
    assert current not in INTENTS, f"{status}/{host} would stay half-way ({current})"
    if host == HostState.RUNNING and status in (S.RUNNING, S.SUSPENDING, S.SNAPSHOTTING, S.RESUMING):
        assert plan is Plan.ADOPT  # a sandbox that runs is never stopped by a restart
    if status == S.SUSPENDED:
        assert current in (S.SUSPENDED, S.FAILED)  # recovery never resumes what the user suspended
