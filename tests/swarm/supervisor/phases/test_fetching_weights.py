"""Fetching a node's weights, without sockets: the request sent, its answer taken, every other message served."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.fetching_weights import FetchingWeights
from checkfree.swarm.supervisor.state import SwarmError
from checkfree.swarm.wire.protocol import Message, MessageType

from helpers.phases import World


def test_the_answer_to_the_request_is_returned_or_the_run_stops_at_the_timeout(tmp_path) -> None:
    world = World(tmp_path)
    phase = FetchingWeights(3, 3, timeout=5.0, part=None)
    world.enter(phase)
    ((to, kind, meta),) = world.link.sent
    assert (to, kind) == (3, "WEIGHTS_REQUEST") and meta == {"stage": 3, "request": phase.request}
    assert not phase.take(Message(MessageType.WEIGHTS_RESPONSE, 3, meta={"request": "another"}), world.ctx)
    answer = Message(MessageType.WEIGHTS_RESPONSE, 3, meta={"request": phase.request})
    assert world.turn(phase).next is phase and phase.take(answer, world.ctx)
    decision = world.turn(phase)
    assert decision.next is DONE and decision.result is answer
    phase = FetchingWeights(3, 0, timeout=5.0, part="head")
    world.enter(phase)
    assert world.link.sent[-1][2]["part"] == "head"
    with pytest.raises(SwarmError, match="node 3 did not answer a weights request within 5 s"):
        world.turn(phase, dt=6.0)
