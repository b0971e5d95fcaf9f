"""A resumed supervisor's verdict on its nodes' claims (checkfree.swarm.supervisor.adoption.judge): which nodes it
takes over, which it replaces, and which iteration is really committed when the old supervisor died mid-commit."""

from __future__ import annotations

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.adoption import CommitIntent, judge
from checkfree.swarm.supervisor.state import Roster, SupervisorState

J = 7
"""The journal's next iteration: every serving replica holds version 7 (iterations 0..6 committed)."""


def _state(attempt: int = 12) -> SupervisorState:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)  # 5 stages x 2 = nodes 0..9
    roster = Roster(cfg, 0, cfg.n_nodes, storage=False)
    for slot in roster.slots:
        slot.serving, slot.version, slot.address = True, J, f"tcp://127.0.0.1:{7000 + slot.slot}"
        roster.by_node[slot.occupant] = slot
    state = SupervisorState(cfg, "ours", 300, None, roster)
    state.iteration, state.attempt = J, attempt
    return state


def _claim(state: SupervisorState, node: int, **change) -> dict:
    slot = state.roster.by_node[node]
    return {
        "stage": slot.stage,
        "version": J,
        "serving": True,
        "attempt": state.attempt,
        "pending": None,
    } | change


def _intent(state: SupervisorState) -> CommitIntent:
    members = state.roster.members()
    ends = {n: {"attempt": 13, "loss": 4.0, "tokens": 64} for n in members[0]}
    return CommitIntent(
        13, J, members, ends, {n: {"attempt": 13, "grad_norm": 1.0} for ids in members.values() for n in ids}
    )


def test_nodes_at_the_journaled_version_are_adopted_and_the_attempt_in_flight_is_redone() -> None:
    state = _state()
    claims = {n: _claim(state, n, attempt=13 if n < 4 else 12) for n in range(10)}  # attempt 13 had begun
    v = judge(state, None, claims, 15.0)
    assert sorted(v.adopt) == list(range(10)) and v.replace == {} and not v.roll_forward
    assert v.in_flight and v.attempt == 13  # the next begin is attempt 14: every node takes it
    quiet = judge(state, None, {n: _claim(state, n) for n in range(10)}, 15.0)
    assert not quiet.in_flight  # the supervisor died between two iterations: nothing to redo


def test_a_claim_that_disagrees_with_the_journal_is_replaced_with_why() -> None:
    state = _state()
    claims = {n: _claim(state, n) for n in range(10) if n != 9}  # node 9 does not answer
    claims[2] = _claim(state, 2, stage=3)
    claims[3] = _claim(state, 3, version=J + 1)  # stepped, but no commit was in flight
    claims[4] = _claim(state, 4, version=J - 2)
    claims[5] = _claim(state, 5, serving=False)  # a replacement still recovering
    v = judge(state, None, claims, 15.0, unasked={})
    assert sorted(v.replace) == [2, 3, 4, 5, 9] and sorted(v.adopt) == [0, 1, 6, 7, 8]
    assert "claims stage 3" in v.replace[2] and "version 8" in v.replace[3] and "version 5" in v.replace[4]
    assert "recovering" in v.replace[5] and "no answer" in v.replace[9]


def test_the_commit_race_rolls_forward_when_any_member_stepped_or_holds_the_gradients() -> None:
    state = _state(attempt=13)
    intent = _intent(state)
    claims = {n: _claim(state, n, attempt=13, pending=13) for n in range(10)}
    for n in (0, 4, 5):
        claims[n] = _claim(state, n, attempt=13, version=J + 1)  # the commit reached them: they stepped
    claims[7] = _claim(state, 7, attempt=13)  # neither stepped nor holds the gradients: behind for good
    v = judge(state, intent, claims, 15.0)
    assert v.roll_forward and v.stepped == [0, 4, 5] and v.pending == [1, 2, 3, 6, 8, 9]
    assert (
        list(v.replace) == [7] and "neither stepped" in v.replace[7]
    )  # replaced by a copy: never steps twice
    assert not v.in_flight and v.attempt == 13


def test_a_commit_no_node_stepped_is_finished_only_if_every_member_can_step_else_redone() -> None:
    state = _state(attempt=13)
    intent = _intent(state)
    claims = {n: _claim(state, n, attempt=13) for n in range(10)}  # nobody holds the gradients any more
    v = judge(state, intent, claims, 15.0)
    assert not v.roll_forward and v.in_flight and sorted(v.adopt) == list(range(10)) and v.replace == {}
    some = judge(state, intent, claims | {3: _claim(state, 3, attempt=13, pending=13)}, 15.0)
    assert not some.roll_forward and some.replace == {}  # redone: no replica is behind, none replaced
    every = judge(state, intent, {n: _claim(state, n, attempt=13, pending=13) for n in range(10)}, 15.0)
    assert every.roll_forward and every.pending == list(range(10)) and every.replace == {}


def test_a_node_outside_the_journaled_commit_that_claims_its_step_is_replaced() -> None:
    state = _state(attempt=13)
    intent = _intent(state)
    intent.members[4].remove(9)  # node 9 was no member of attempt 13 (it served only after its begin)
    claims = {n: _claim(state, n, attempt=13, pending=13) for n in range(10)}
    claims[9] = _claim(state, 9, attempt=13, version=J + 1)  # claims the step of a commit it had no part in
    v = judge(state, intent, claims, 15.0)
    assert 9 in v.replace and 9 not in v.adopt and 9 not in v.stepped
    assert "version 8" in v.replace[9]
    assert v.roll_forward and v.stepped == [] and v.pending == list(range(9))  # the members all hold it


def test_only_the_gradients_of_the_intent_s_attempt_count_as_pending() -> None:
    state = _state(attempt=13)
    intent = _intent(state)
    claims = {n: _claim(state, n, attempt=13, pending=13) for n in range(10)}
    claims[3] = _claim(state, 3, attempt=13, pending=12)  # holds the gradients of an older attempt
    v = judge(state, intent, claims, 15.0)
    assert not v.roll_forward and v.in_flight and v.pending == []  # not every member can step: redone
    claims[0] = _claim(state, 0, attempt=13, version=J + 1)  # a member stepped: the commit is finished
    v = judge(state, intent, claims, 15.0)
    assert v.roll_forward and 3 not in v.pending and "neither stepped" in v.replace[3]
    outsider = {n: _claim(state, n, attempt=13, pending=13) for n in range(10)}
    intent.members[4].remove(9)  # node 9 was no member: its claim to hold attempt 13's gradients is no one's
    v = judge(state, intent, outsider, 15.0)
    assert v.roll_forward and v.pending == list(range(9)) and "no member" in v.replace[9]
