"""A replacement executes the supervisor's plan through the one table of recovery rules (checkfree.recovery.rules)
and reports the one recovery record (checkfree.recovery.record); a rule the table does not hold is an error, never
a copy."""

from __future__ import annotations

import pytest
import torch

from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import SCHEMA_KEYS
from checkfree.recovery.rules import UnknownRule
from checkfree.swarm.wire import control
from checkfree.swarm.wire.protocol import Message, MessageType

from helpers.swarm import FakeNode, weights_answer


def _fetch(node: FakeNode, plan: RecoveryPlan, **change) -> None:
    """Start ``plan``'s fetch on ``node`` and answer its one request from the node asked."""
    rec = node.recovery(plan)
    rec.start()
    ((to, request),) = node.sent
    rec.on_response(weights_answer(node, to, request["request"], **change))


def test_a_replacement_rebuilds_by_the_rule_table_and_reports_the_one_record() -> None:
    node = FakeNode()
    source = {f"w.{k}": torch.full_like(v, 0.25) for k, v in node.module.state_dict().items()}
    _fetch(node, RecoveryPlan("copy", (1,)), tensors=source)
    ((state, record),) = node.done
    assert all(torch.equal(v, torch.full_like(v, 0.25)) for v in state.module.state_dict().values())
    assert list(record)[: len(SCHEMA_KEYS)] == list(
        SCHEMA_KEYS
    )  # the schema's keys, in order, then the fetch's
    assert (record["stage"], record["rule"], record["source_stages"], record["weights"]) == (
        1,
        "copy",
        [1],
        [1.0],
    )
    assert record["source_nodes"] == [3] and "sources" not in record and record["bytes"] > 0
    meta = {"command": "serving", "stage": 1, "version": 3, "record": record}
    control.check(Message(MessageType.CONTROL, 20, meta=meta))  # the wire takes it, strictly
    ladder = FakeNode()  # a plan of the exactness ladder: its rung travels with the record
    _fetch(ladder, RecoveryPlan("copy", (1,), fallback="no live replica", rung="neighbour"))
    ((_, record),) = ladder.done
    assert (record["rung"], record["fallback"]) == ("neighbour", "no live replica")


def test_a_rule_the_table_does_not_hold_is_an_error_never_a_copy() -> None:
    node = FakeNode()
    with pytest.raises(UnknownRule, match="'mystery' is not in the rule table"):
        _fetch(node, RecoveryPlan("mystery", (1,)))
    assert node.done == [] and node.gave_up == []
