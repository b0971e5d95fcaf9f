"""The resuming phases without sockets: the journaled processes taken over, the launchers and nodes dialled and
asked, their answers awaited (what their queues held for the dead supervisor dropped, counted), then judged."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.adopting import Adopting
from checkfree.swarm.supervisor.phases.resuming import AskingNodes, AwaitingAnswers, Resuming
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import Message, MessageType

from helpers.phases import World


def test_the_nodes_are_asked_and_their_answers_awaited_until_every_one_answered(tmp_path) -> None:
    world = World(tmp_path)
    state = world.state
    state.resumed_from = {"written": 0.0, "processes": {"0": [123, 456]}}
    state.roster.launcher_addresses = {1_000_000: "tcp://10.0.0.2:7000"}
    decision = world.enter(Resuming())
    assert [(a.part, a.op, a.args) for a in decision.actions] == [
        ("host", "adopt", (0, 123, 456)),
        ("supervisor", "dial", (1_000_000, "tcp://10.0.0.2:7000")),
    ]
    assert isinstance(decision.next, AskingNodes)
    decision = world.enter(decision.next)  # no process of this machine runs (the fake host has none)
    assert all(why == "its process is gone" for why in decision.next.unasked.values())
    for slot in state.roster.slots:
        slot.local = False  # another machine's: asked
    decision = world.enter(AskingNodes(0.0))
    asked = [a.args[0] for a in decision.actions if a.op == "ask"]
    assert asked == world.nodes() and decision.actions[-1].op == "warm_up"
    phase = decision.next
    assert isinstance(phase, AwaitingAnswers)
    world.enter(phase)
    stale = Message(MessageType.CONTROL, 0, meta=control("ready", attempt=3, grad_norm=1.0, pipelines=1))
    answer = Message(MessageType.CONTROL, 0, meta={"command": "resumed"})
    assert phase.take(stale, world.ctx) and not phase.take(answer, world.ctx)
    assert state.stale_after_resume == 1
    world.reports("resumed", asked[:-1], attempt=9)
    assert world.turn(phase).next is phase
    world.reports("resumed", asked[-1:], attempt=9)
    assert isinstance(world.turn(phase).next, Adopting)


def test_the_answers_are_judged_at_the_deadline(tmp_path) -> None:
    world = World(tmp_path)
    phase = AwaitingAnswers([0, 1], {}, 0.0)
    world.enter(phase)
    assert world.turn(phase, dt=phase.wait - 1).next is phase
    assert isinstance(world.turn(phase, dt=2).next, Adopting)
