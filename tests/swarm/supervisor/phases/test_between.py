"""The phase between attempts, without sockets: the last commit journaled, then the wait for a returning node, the
recovery, the next attempt, or the end at the target."""

from __future__ import annotations

from checkfree.failures.traces import DowntimeSchedule
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.base import kill
from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.phases.gathering import GatheringModel
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.phases.training import ScheduleOver
from checkfree.swarm.supervisor.phases.validating import Validating
from checkfree.swarm.supervisor.phases.waiting import WaitingForReturns

from helpers.phases import World


def test_the_last_commit_is_journaled_then_the_next_attempt_runs(tmp_path) -> None:
    world = World(tmp_path)
    state = world.state
    state.iteration, state.commit_unjournaled, state.intent = 4, True, object()
    decision = world.enter(Between())
    assert [(a.op, a.args) for a in decision.actions] == [
        ("write", ("committed iteration 3",)),
        ("die_if", ("committed", 3)),
    ]
    assert state.intent is None and not state.commit_unjournaled
    assert isinstance(decision.next, Attempting) and decision.next.it == 4
    assert world.enter(Between()).actions == []  # journaled once


def test_a_dead_slot_is_recovered_and_a_stranded_stage_waited_for(tmp_path) -> None:
    world = World(tmp_path)
    world.carry_out([kill(world.state.roster.slots[2], "test")])
    assert isinstance(world.enter(Between()).next, Recovering)
    schedule = DowntimeSchedule(4, 1, 20, 60.0, {2: [(0, 5)]})
    world = World(tmp_path, schedule=schedule)
    slot = world.state.roster.slots[2]
    world.carry_out([kill(slot, "test")])
    world.outages.keep_away(slot, world.outages.fire(slot, 0))
    assert isinstance(world.enter(Between()).next, WaitingForReturns)


def test_at_the_target_the_run_ends_validating_the_last_weights_if_they_were_not(tmp_path) -> None:
    world = World(tmp_path, iterations=4)
    world.state.iteration, world.state.commits = 4, 4
    decision = world.enter(Between())
    assert isinstance(decision.next, Validating) and isinstance(decision.next.then, GatheringModel)
    world.ctx.validation.commits = 4  # validated at these commits already
    assert isinstance(world.enter(Between()).next, GatheringModel)


def test_a_replayed_traces_window_over_ends_the_run(tmp_path) -> None:
    world = World(tmp_path, schedule=DowntimeSchedule(4, 1, 3, 60.0, {}))
    world.state.schedule_clock = 3
    decision = world.enter(Between())
    assert isinstance(decision.next, ScheduleOver)
    ending = world.enter(decision.next)
    assert ending.actions[0].op == "ended_by_schedule" and isinstance(
        ending.next, (Validating, GatheringModel)
    )
