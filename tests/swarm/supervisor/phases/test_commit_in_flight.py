"""A stop signal after the commit went out, without sockets: the commit is waited for and recorded."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.commit_in_flight import CommitInFlight

from helpers.phases import World


def _in_commit(world: World) -> Attempting:
    phase = Attempting(0)
    world.enter(phase)
    world.reports("iteration_end", world.stage0(), attempt=1, loss=2.0, tokens=64)
    world.turn(phase)
    world.reports("ready", world.nodes(), attempt=1, grad_norm=1.0)
    world.turn(phase)
    assert world.state.current.phase == "commit"
    return phase


def test_an_interrupt_in_the_commit_phase_waits_for_the_commit_and_records_it(tmp_path) -> None:
    world = World(tmp_path)
    attempt = _in_commit(world)
    follow = attempt.interrupted(world.ctx)
    assert isinstance(follow, CommitInFlight)
    world.enter(follow)
    assert world.turn(follow).next is follow
    world.reports("committed", world.nodes(), attempt=1, version=1)
    decision = world.turn(follow)
    assert decision.next is DONE and [a.op for a in decision.actions] == ["committed", "forget_intent"]
    assert world.results.rows[-1]["iteration"] == 0
    assert world.enter(CommitInFlight(0)).next is DONE  # recorded already


def test_an_unconfirmed_commit_is_left_unrecorded_after_request_timeout(tmp_path) -> None:
    world = World(tmp_path)
    follow = _in_commit(world).interrupted(world.ctx)
    world.enter(follow)
    assert world.turn(follow, dt=world.cfg.request_timeout + 1).next is DONE and world.results.rows == []
    world.state.current.phase = "sync"  # before the commit went out, a stop signal just stops the run
    assert Attempting(0).interrupted(world.ctx) is None
