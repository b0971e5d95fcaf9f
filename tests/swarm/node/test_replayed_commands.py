"""A command or claim that arrives again, or ahead of where the swarm is, changes nothing on a node
(checkfree.swarm.node.iteration, .context): a replayed ``begin`` of the attempt a node is in never resets it
mid-attempt, and a peer's weights may claim at most the iteration the supervisor has begun + 1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.iteration import IterationCommands
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

from helpers.swarm import FakeNode, Sent, weights_answer

MEMBERS = {"0": [0, 1], "1": [3, 4]}


def _commands() -> tuple[IterationCommands, AttemptClock, list[str]]:
    """Node 3 of stage 1 at attempt 4 (iteration 7), mid-forward; its parts' resets are recorded."""
    module = torch.nn.Linear(2, 2)
    calls: list[str] = []
    parts = SimpleNamespace(
        state=StageState(module, W.make_optimizer(module, 1e-2), version=7),
        gradients=SimpleNamespace(reduced=-1, norm=1.0, reset=lambda: calls.append("gradients.reset")),
        worker=SimpleNamespace(reset=lambda: calls.append("worker.reset")),
        pipeline=object(),
        stage0_copies=SimpleNamespace(push=lambda: calls.append("push")),
    )
    clock = AttemptClock(attempt=4, iteration=7, max_version=7)
    ctx = NodeContext(3, 1, clock, Membership(3), Sent())
    commands = IterationCommands(ctx, parts, lambda msg: None, lambda: True, lambda: None, dict)
    return commands, clock, calls


def test_a_replayed_begin_of_the_current_attempt_is_refused_and_resets_nothing() -> None:
    commands, clock, calls = _commands()
    with pytest.raises(ProtocolError, match="begin of attempt 4; this node is at attempt 4 already"):
        commands.begin({"attempt": 4, "iteration": 7, "members": MEMBERS})
    assert calls == [] and (clock.attempt, clock.iteration) == (4, 7)  # its activations and gradients kept
    with pytest.raises(ProtocolError, match="begin of attempt 3"):
        commands.begin({"attempt": 3, "iteration": 7, "members": MEMBERS})
    commands.begin({"attempt": 5, "iteration": 7, "members": MEMBERS})  # the next attempt: a fresh start
    assert calls == ["worker.reset", "gradients.reset", "push"] and clock.attempt == 5


def test_a_weights_version_is_plausible_up_to_the_begun_iteration_plus_one() -> None:
    clock = AttemptClock(attempt=4, iteration=7, max_version=7)
    assert clock.plausible_version(8) and not clock.plausible_version(9)  # 8: a replica stepped iteration 7
    clock.max_version = 9  # a WELCOME or a rollback said iteration 9 was reached
    assert clock.plausible_version(9) and not clock.plausible_version(10)
    # through a replacement's fetch: node 20 at iteration 3 takes version 4 and refuses version 5
    ok, ahead = FakeNode(), FakeNode()
    for node, version in ((ok, 4), (ahead, 5)):
        rec = node.recovery(RecoveryPlan("copy", (1,)))
        rec.start()
        ((to, request),) = node.sent
        rec.on_response(weights_answer(node, to, request["request"], meta={"version": version}))
    assert len(ok.done) == 1 and ok.rejected == []
    assert ahead.done == [] and any("claims version 5, ahead of the swarm" in r for r in ahead.rejected)


def test_a_reroute_is_taken_once_in_sequence_and_then_lets_the_messages_that_waited_for_it_through() -> None:
    """Node 3 (stage 1) at attempt 4: a ``reroute`` of another attempt changes nothing, one out of sequence is
    refused, the next one takes the new lists (node 4 gone: pipeline 1 moves, its saved activations go), and
    then the peer messages stamped with that re-route, which waited in the early buffer, are dispatched (one
    stamped with a later re-route keeps waiting)."""
    module = torch.nn.Linear(2, 2)
    forgot: list[list[int]] = []
    dispatched: list[int] = []
    parts = SimpleNamespace(
        state=StageState(module, W.make_optimizer(module, 1e-2), version=7),
        gradients=SimpleNamespace(reduced=-1, cfg=SimpleNamespace(n_stages=1)),
        worker=SimpleNamespace(forget=forgot.append, gradients=SimpleNamespace(drop=lambda p: None)),
        pipeline=object(),
        takeover=None,
    )
    clock = AttemptClock(attempt=4, iteration=7, max_version=7)
    membership = Membership(3)
    membership.set_members(MEMBERS)
    ctx = NodeContext(3, 1, clock, membership, Sent())
    commands = IterationCommands(
        ctx, parts, lambda m: dispatched.append(m.microbatch), lambda: True, lambda: None, dict
    )
    for mb, reroutes in ((0, 1), (1, 2)):
        clock.future.add(Message(MessageType.FORWARD, 0, 7, mb, {"attempt": 4, "reroutes": reroutes}))
    after = {"0": [0, 1], "1": [3]}
    commands.reroute({"attempt": 3, "members": after, "dead": [4], "seq": 1})  # an attempt that is over
    assert clock.reroutes == 0 and membership.members[1] == [3, 4]
    with pytest.raises(ProtocolError, match="reroute 2 of attempt 4; 0 taken"):
        commands.reroute({"attempt": 4, "members": after, "dead": [4], "seq": 2})
    commands.reroute({"attempt": 4, "members": after, "dead": [4], "seq": 1})
    assert clock.reroutes == 1 and membership.members[1] == [3] and membership.at_begin()[1] == [3, 4]
    assert forgot == [[1]] and dispatched == [0] and len(clock.future.messages) == 1


def test_a_message_of_a_reroute_not_taken_yet_waits_and_one_implausibly_far_ahead_is_refused() -> None:
    clock = AttemptClock(attempt=4, iteration=7, reroutes=1)

    def forward(reroutes: int) -> Message:
        return Message(MessageType.FORWARD, 0, 7, 0, {"attempt": 4, "reroutes": reroutes})

    assert not clock.waits_for_reroute(forward(1), limit=3) and not clock.waits_for_reroute(forward(0), 3)
    assert clock.waits_for_reroute(forward(2), limit=3) and clock.waits_for_reroute(forward(4), limit=3)
    with pytest.raises(ProtocolError, match="implausibly far ahead"):
        clock.waits_for_reroute(forward(5), limit=3)
    assert len(clock.future.messages) == 2
