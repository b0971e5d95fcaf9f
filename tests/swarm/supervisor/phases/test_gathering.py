"""Gathering the model, without sockets: one serving replica per stage asked; only weights answers are taken."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.gathering import GatheringModel
from checkfree.swarm.supervisor.phases.shutting_down import ShuttingDown
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import Message, MessageType

from helpers.phases import World


def test_the_model_is_asked_for_then_written_when_the_answers_settle_or_at_the_deadline(tmp_path) -> None:
    world = World(tmp_path)
    phase = GatheringModel(then=ShuttingDown())
    decision = world.enter(phase)
    assert decision.actions[0].op == "gather" and decision.actions[0].args[0] == world.state.roster.members()
    other = Message(MessageType.CONTROL, 0, meta=control("ready", attempt=3, grad_norm=1.0, pipelines=1))
    assert phase.take(other, world.ctx) and not phase.take(
        Message(MessageType.WEIGHTS_RESPONSE, 0), world.ctx
    )
    pending = type("Fetch", (), {"complete": lambda self: False, "failed": None})()
    world.ctx.model_io.gather_fetch = pending  # (the fake world carries out no gather)
    assert world.turn(phase).next is phase  # an answer is missing
    world.ctx.model_io.gather_fetch = None
    decision = world.turn(phase)
    assert [a.op for a in decision.actions] == ["finish_snapshots", "write_model"]
    assert isinstance(decision.next, ShuttingDown)
    phase = GatheringModel()
    world.enter(phase)
    world.ctx.model_io.gather_fetch = pending  # an answer that never comes
    decision = world.turn(phase, dt=world.cfg.request_timeout + 1)
    assert decision.next is DONE and [a.op for a in decision.actions] == ["finish_snapshots", "write_model"]
