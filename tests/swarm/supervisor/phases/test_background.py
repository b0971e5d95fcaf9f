"""Recovery in the background (issue 39 point 3), without sockets: a dead replica of a stage that still serves is
replaced at the boundary without the pausing recovery phase; a whole-stage loss keeps it; a replacement joins
only at the swarm's version with no attempt in flight, and a boundary waits at most JOIN_WAIT_S for one that was
current before the last commit."""

from __future__ import annotations

from checkfree.swarm.supervisor.inbox import joinable
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.background import JOIN_WAIT_S, Background, Joining
from checkfree.swarm.supervisor.phases.base import kill
from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.state import Attempt

from helpers.phases import World


def _world(tmp_path) -> World:
    world = World(tmp_path, replicas=2)
    world.serve_at_once = False  # a replacement started stays recovering
    return world


def test_a_dead_replica_is_replaced_in_the_background_and_the_next_attempt_runs(tmp_path) -> None:
    world = _world(tmp_path)
    slot = next(s for s in world.state.roster.slots if s.stage == 1)
    world.carry_out([kill(slot, "test")])
    decision = world.enter(Between())
    assert isinstance(decision.next, Background)
    decision = world.enter(decision.next)
    assert [(a.part, a.op) for a in decision.actions] == [
        ("planner", "answer_replans"),
        ("planner", "plan_event"),
        ("processes", "replace_dead"),
    ]
    assert isinstance(decision.next, Attempting) and not slot.dead and not slot.serving
    decision = world.enter(Between())  # it still recovers: nothing started again, the swarm goes on
    assert isinstance(decision.next, Background)
    assert isinstance(world.enter(decision.next).next, Attempting)


def test_a_whole_stage_loss_still_pauses(tmp_path) -> None:
    world = _world(tmp_path)
    world.carry_out([kill(s, "test") for s in world.state.roster.slots if s.stage == 2])
    assert isinstance(world.enter(Between()).next, Recovering)


def test_a_stage0_replica_loss_still_pauses(tmp_path) -> None:
    # each stage-0 member drives one pipeline: an attempt without it would train on a smaller global batch
    world = _world(tmp_path)
    world.carry_out([kill(world.state.roster.slots[1], "test")])
    assert world.state.roster.slots[1].stage == 0
    assert isinstance(world.enter(Between()).next, Recovering)


def test_a_replacement_joins_only_at_the_swarms_version_between_attempts(tmp_path) -> None:
    state = _world(tmp_path).state
    state.iteration = 5
    assert joinable(state, 5) and not joinable(state, 4) and not joinable(state, 6)
    state.current = Attempt(9, 5, {}, 0.0)  # an attempt in flight: its commit would leave it behind
    assert not joinable(state, 5)
    state.current.phase = "over"
    assert joinable(state, 5)


def test_the_boundary_waits_a_little_for_a_replacement_one_update_from_joining(tmp_path) -> None:
    world = _world(tmp_path)
    state, slot = world.state, next(s for s in world.state.roster.slots if s.stage == 1)
    world.carry_out([kill(slot, "test")])
    world.enter(Background(3))  # started: recovering
    state.iteration = 4
    state.candidates[slot.occupant] = 3  # it reported version 3; iteration 3 committed since
    decision = world.enter(Background(4))
    assert isinstance(decision.next, Joining)
    joining = decision.next
    world.enter(joining)
    assert world.turn(joining).next is joining  # waits
    decision = world.turn(joining, dt=JOIN_WAIT_S + 0.1)  # not in time: it joins at a later boundary
    assert isinstance(decision.next, Attempting)
    state.candidates[slot.occupant] = 2  # further behind: no wait
    assert isinstance(world.enter(Background(4)).next, Attempting)
