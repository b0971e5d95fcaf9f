"""The rolling-back phase without sockets (``checkpoint``): every node not at the checkpoint restores it; a death
or a passed deadline stops the run."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.phases.base import kill
from checkfree.swarm.supervisor.phases.recovering import Recovered, Recovering
from checkfree.swarm.supervisor.phases.rolling_back import RollingBack
from checkfree.swarm.supervisor.state import Attempt, SwarmError

from helpers.phases import World


def _lost_stage(tmp_path) -> tuple[World, RollingBack]:
    world = World(tmp_path, "checkpoint")
    state, roster = world.state, world.state.roster
    state.checkpoints.stored = {s: {0, 4} for s in range(world.cfg.n_stages + 1)}
    state.current = Attempt(9, 6, roster.members(), 0.0, phase="over")
    state.iteration = 6
    for slot in roster.slots:
        slot.version = 6
    world.carry_out([kill(roster.slots[2], "test")])
    phase = Recovering(6)
    world.enter(phase)
    assert world.turn(phase).next is phase  # its replacement starts (and serves at once)
    decision = world.turn(phase)
    assert isinstance(decision.next, RollingBack) and decision.next.version == 4
    return world, decision.next


def test_a_lost_stage_rolls_every_node_back_and_the_iterations_since_are_redone(tmp_path) -> None:
    world, phase = _lost_stage(tmp_path)
    world.enter(phase)
    targets = {s.occupant for s in world.state.roster.slots if s.version != 4}
    assert {to for to, c, m in world.link.sent if c == "rollback" and m == {"version": 4}} == targets
    world.reports("restored", sorted(targets)[:-1], version=4, bytes=100)
    assert world.turn(phase).next is phase
    world.reports("restored", sorted(targets)[-1:], version=4, bytes=100)
    decision = world.turn(phase)
    assert isinstance(decision.next, Recovered) and world.state.iteration == 4
    assert decision.actions[0].args == (6, 4, {2}, 100 * len(targets))
    assert decision.actions[1].args == ("rolled back to iteration 4",)


def test_a_death_or_the_deadline_during_a_rollback_stops_the_run(tmp_path) -> None:
    world, phase = _lost_stage(tmp_path)
    world.enter(phase)
    with pytest.raises(SwarmError, match="rollback to iteration 4 did not finish"):
        world.turn(phase, died=True)
    with pytest.raises(SwarmError, match="rollback to iteration 4 did not finish"):
        world.turn(phase, dt=world.cfg.recovery_timeout + 1)
