"""The recovering phase without sockets: the dead are replaced by the loss event's plans; a crash during the
recovery is a new loss event, planned before any replacement of it starts; every slot serving ends it."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.recovering import Recovered, Recovering
from checkfree.swarm.supervisor.state import Attempt, SwarmError

from helpers.phases import World


def _ops(decision) -> list[tuple[str, str]]:
    return [(a.part, a.op) for a in decision.actions]


def test_a_crash_during_recovery_is_planned_before_its_replacement_starts(tmp_path) -> None:
    world = World(tmp_path, "ours", replicas=2)
    roster = world.state.roster
    world.state.current = Attempt(4, 5, roster.members(), 0.0, phase="over")
    world.serve_at_once = False
    world.carry_out([world_kill(roster.slots[2])])  # stage 1, replica 0
    phase = Recovering(5)
    decision = world.enter(phase)
    assert _ops(decision) == [("results", "stages_lost"), ("planner", "plan_event")]
    assert roster.slots[2].plan.rule == "replica"  # a copy of the live replica of its stage
    world.turn(phase)
    first = roster.slots[2].occupant
    assert first >= world.cfg.first_replacement_id and not roster.slots[2].serving
    roster.slots[2].address = "tcp://127.0.0.1:9100"  # it joined and recovers
    world.carry_out([world_kill(roster.slots[3])])  # its source dies: stage 1 is lost
    decision = world.turn(phase, died=True)
    ops = _ops(decision)
    assert ops.index(("planner", "plan_event")) < ops.index(("processes", "replace_dead"))
    assert decision.actions[ops.index(("planner", "plan_event"))].args == ({1},)
    assert roster.slots[2].plan.rule != "replica" and roster.slots[3].plan == roster.slots[2].plan
    assert ("failpoints", "die_if") in ops  # a replacement is mid-recovery
    for slot in roster.slots:
        slot.serving = True
    decision = world.turn(phase)
    assert isinstance(decision.next, Recovered)
    world.carry_out(decision.actions)
    after = world.enter(decision.next)
    assert isinstance(after.next, Attempting) and after.result == 0
    assert after.actions[0].op == "recovered" and after.actions[0].args[0] == {2}  # the crashes it began with
    assert all(s.tries == 0 for s in roster.all())


def test_a_stage_lost_without_a_checkpoint_every_stage_stored_stops_the_run(tmp_path) -> None:
    world = World(tmp_path, "checkpoint")
    world.state.current = Attempt(7, 6, world.state.roster.members(), 0.0, phase="over")
    world.carry_out([world_kill(world.state.roster.slots[2])])
    with pytest.raises(SwarmError, match=r"stages \[2\] were lost and cannot be rolled back"):
        world.enter(Recovering(6))


def world_kill(slot):
    from checkfree.swarm.supervisor.phases.base import kill

    return kill(slot, "test")
