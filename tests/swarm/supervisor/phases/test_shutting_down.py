"""Shutting down, without sockets: ``shutdown`` to every node, their final statistics awaited, the launchers told."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.shutting_down import SHUTDOWN_TIMEOUT_S, ShuttingDown

from helpers.phases import World


def test_the_final_statistics_are_awaited_then_the_launchers_told(tmp_path, caplog) -> None:
    world = World(tmp_path)
    world.state.roster.launchers = {1_000_000}
    phase = ShuttingDown()
    world.enter(phase)
    assert world.link.commands() == ["shutdown"]
    world.reports("final", world.nodes()[:-1], sent_bytes=1)
    assert world.turn(phase).next is phase
    world.reports("final", world.nodes()[-1:], sent_bytes=1)
    decision = world.turn(phase)
    assert decision.next is DONE and decision.actions[0].args[0].keys() == set(world.nodes())
    assert [(to, c) for to, c, _ in world.link.sent[-1:]] == [(1_000_000, "shutdown")]
    phase = ShuttingDown()
    world.enter(phase)
    decision = world.turn(phase, dt=SHUTDOWN_TIMEOUT_S + 1)
    assert decision.next is DONE and "no final stats from nodes" in caplog.text
