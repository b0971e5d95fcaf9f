"""No silent waits in recovery: a source that will not serve a weights request says why at once, and the
requester moves to its next source or asks the supervisor for a new plan (checkfree/swarm/node/parts.py,
checkfree/swarm/node/recovering.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.node import Node
from checkfree.swarm.node.parts import WeightGrants
from checkfree.swarm.wire import control
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

from helpers.swarm import FakeNode, Sent, weights_answer


def _refusal(sender: int, request: str, reason: str, **extra: object) -> Message:
    meta = {"stage": 1, "request": request, "refused": reason, **extra}
    return Message(MessageType.WEIGHTS_RESPONSE, sender, meta=meta)


def test_a_refused_request_goes_to_the_next_source_then_to_the_supervisor_at_once() -> None:
    node = FakeNode()
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    ((target, meta),) = node.sent
    assert target == 3 and meta["seq"] == 0  # every request names the plan it is made under
    rec.on_response(_refusal(3, meta["request"], "grant_used"))
    target, meta = node.sent[-1]
    assert target == 5 and meta["seq"] == 0  # the next source, at once
    rec.on_response(_refusal(5, meta["request"], "no_grant"))
    peer, ask = node.sent[-1]
    assert peer == -1 and ask == control.control("replan", reason=ask["reason"], seq=0)  # no source is left
    assert "refused plan 0" in ask["reason"] and len(node.sent) == 3 and not node.gave_up
    rec.replan(
        RecoveryPlan("replica", (1,)), {"1": [3, 5]}, seq=1
    )  # the supervisor's new plan: a fresh start
    target, meta = node.sent[-1]
    assert target == 3 and meta["seq"] == 1
    rec.on_response(weights_answer(node, 3, meta["request"]))
    assert node.done and not node.rejected


def test_plan_superseded_waits_for_the_newer_plan_on_its_way() -> None:
    node = FakeNode()
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    ((_, meta),) = node.sent
    rec.on_response(_refusal(3, meta["request"], "plan_superseded"))
    peer, ask = node.sent[-1]
    assert (
        peer == -1 and ask["command"] == "replan" and rec.plan_deadline is not None
    )  # no other source is asked
    assert len(node.sent) == 2


def test_a_refusal_that_carries_anything_else_is_rejected() -> None:
    node = FakeNode()
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    ((_, meta),) = node.sent
    with pytest.raises(ProtocolError, match="more than"):
        rec.on_response(_refusal(3, meta["request"], "no_grant", version=3))
    answer = weights_answer(node, 3, meta["request"], meta={"refused": "no_grant"})
    with pytest.raises(ProtocolError, match="more than"):
        rec.on_response(answer)  # weights with a refusal: nothing of it is kept
    with pytest.raises(ProtocolError, match="refusal"):
        control.check(_refusal(3, "r", "because"))  # the wire takes only the known reasons


def _source(clock: list[float]) -> tuple[Node, Sent]:
    """A serving stage-1 node 3 that lists node 20 (a replacement) and node 21 (not yet), as Node's methods see it."""
    node = Node.__new__(Node)
    module = torch.nn.Linear(2, 2)
    state = StageState(module, W.make_optimizer(module, 1e-3))
    sent = Sent()
    membership = Membership(3, peers={20: {"stage": 1}}, members={1: [3]})
    node.ctx = NodeContext(3, 1, AttemptClock(), membership, sent)
    node.id, node.serving, node.state = 3, True, state
    node.bad_messages, node.rejected_from = 0, {}
    node.waiting = FutureBuffer(64, 64 * 1024, per_sender=4)
    grants = WeightGrants(state, window_s=60.0, clock=lambda: clock[0])
    node.parts = SimpleNamespace(grants=grants, stage0_copies=None)
    return node, sent


def _request(sender: int, request: str, seq: int) -> Message:
    return Message(MessageType.WEIGHTS_REQUEST, sender, meta={"stage": 1, "request": request, "seq": seq})


def test_a_source_refuses_at_once_and_a_request_whose_grant_never_comes_is_refused_after_its_wait() -> None:
    clock = [0.0]
    node, sent = _source(clock)
    node.parts.grants.grant({"requester": 20, "stage": 1, "optimizer": False, "seq": 1})
    node._on_weights_request(_request(20, "late", seq=0))  # a request of the plan that plan 1 replaced
    assert sent[-1] == (20, {"stage": 1, "request": "late", "refused": "plan_superseded"}, {})
    assert node.bad_messages == 0  # a late request is no offence
    node._on_weights_request(_request(20, "now", seq=1))
    assert sent[-1][0] == 20 and sent[-1][1]["request"] == "now" and sent[-1][2]  # the weights
    node._on_weights_request(_request(20, "early", seq=2))  # its grant is on its way: it waits
    node._on_weights_request(_request(21, "stranger", seq=0))  # not listed yet: it waits
    assert len(sent) == 2 and len(node.waiting.messages) == 2
    node._expire_requests()
    clock[0] += node.parts.grants.wait_s
    node._expire_requests()
    assert sent[-1] == (20, {"stage": 1, "request": "early", "refused": "no_grant"}, {})
    assert node.waiting.messages == [] and node.rejected_from == {21: 1}  # the stranger: dropped, counted
    assert node.parts.grants.refused == {"plan_superseded": 1, "no_grant": 1}
