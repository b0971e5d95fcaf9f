"""Validating, without sockets: ``evaluate`` to every serving node, the result when every stage-0 member reported;
a death or iteration_timeout gives it up."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.validating import Validating

from helpers.phases import World


def test_a_validation_finishes_or_is_given_up(tmp_path) -> None:
    world = World(tmp_path)
    phase = Validating()
    world.enter(phase)
    assert world.link.commands() == ["evaluate"] * len(world.nodes())
    assert world.turn(phase).next is phase
    world.ctx.validation.reports = {0: {"loss_sum": 4.0, "batches": 2}}
    decision = world.turn(phase)
    assert decision.next is DONE and [a.op for a in decision.actions] == ["finish"]
    world.state.attempt += 1
    phase = Validating()
    world.enter(phase)
    decision = world.turn(phase, died=True)
    assert decision.next is DONE and [(a.op, a.args) for a in decision.actions] == [
        ("give_up", ("a node died",))
    ]
    world.state.attempt += 1
    phase = Validating()
    world.enter(phase)
    decision = world.turn(phase, dt=world.cfg.iteration_timeout + 1)
    assert decision.actions[0].op == "give_up" and "within 300 s" in decision.actions[0].args[0]


def test_a_validation_that_cannot_begin_moves_on(tmp_path) -> None:
    world = World(tmp_path)
    world.state.roster.slots[2].serving = False  # stage 2 has no serving replica
    phase = Validating()
    world.enter(phase)
    assert world.link.sent == [] and world.turn(phase).next is DONE
    assert world.results.model.validation_given_up[-1]["why"] == "stages [2] have no serving replica"
