"""Waiting for a returning node, without sockets: one schedule iteration per deadline; the crashes due meanwhile
fire (journaled first), the slots due back come back, and the wait ends when no stage is stranded."""

from __future__ import annotations

from checkfree.failures.traces import DowntimeSchedule
from checkfree.swarm.supervisor.phases.attempt import crash_actions
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.phases.waiting import WaitingForReturns

from helpers.phases import World


def test_a_stranded_stage_is_waited_for_until_its_slot_comes_back(tmp_path) -> None:
    world = World(tmp_path, schedule=DowntimeSchedule(4, 1, 20, 60.0, {2: [(0, 3)], 3: [(1, 1)]}))
    outages = world.outages
    for slot in outages.due(0):
        world.carry_out(crash_actions(world.ctx, slot, 0, outages.fire(slot, 0)))
    assert outages.stranded() == [2]
    phase = WaitingForReturns(0)
    world.enter(phase)
    assert world.turn(phase, dt=0.5).next is phase  # 1 s per schedule iteration: none committed yet
    decision = world.turn(phase, dt=0.6)
    assert decision.actions[0].args == ("scheduled crashes at schedule iteration 1",)  # slot 3's [1, 1]
    assert [a.op for a in decision.actions[1:]] == ["scheduled_kill", "kill"] and decision.next is phase
    decision = world.turn(phase, dt=1.1)
    assert decision.next is phase and world.state.schedule_clock == 2
    decision = world.turn(phase, dt=1.1)  # slot 2 is back at 3: the wait ends, its stage is recovered
    assert isinstance(decision.next, Recovering) and decision.result[0] == {2: 3}
    wait = world.results.journal_fields()["waits"][-1]
    assert (wait["from"], wait["to"], wait["stages"]) == (0, 3, [2])
