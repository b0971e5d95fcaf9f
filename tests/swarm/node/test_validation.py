"""A node's side of a validation (checkfree.swarm.node.validation): stage 0 sends its share of the validation
batches along the route with the stages in order and reports the simulator's loss; a transformer stage relays them
forward only; a VALIDATION off its evaluation's route, of an evaluation not begun yet, or with NaN is handled as the
data plane handles a FORWARD."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from checkfree.pipeline import forward_loss
from checkfree.swarm.node.compute import build_stage, validation_batches_for
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.validation import NodeValidation
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError, Rejected

from helpers.swarm import live_config

MEMBERS = {0: [0, 1], 1: [2, 3], 2: [4, 5], 3: [6, 7]}
"""The serving replicas of the live test swarm (3 transformer stages × 2 replicas)."""


class Wire(list):
    """A node's ``send``: records (to, message) as the peer would receive it."""

    def __init__(self, me: int) -> None:
        super().__init__()
        self.me = me

    def __call__(self, peer, mtype, iteration=-1, microbatch=-1, meta=None, tensors=None) -> None:
        meta = dict(meta or {})
        if mtype != MessageType.CONTROL:
            meta.setdefault("stage", -9)
        self.append((peer, Message(mtype, self.me, iteration, microbatch, meta, dict(tensors or {}))))


def node(tmp_path: Path, node_id: int, validation: int = 3) -> tuple[NodeValidation, Wire, list]:
    """Node ``node_id`` of the tiny swarm (its stage's seeded weights); its sends are recorded, and a message it
    replays (an early one) is recorded in the returned list and handled."""
    cfg = live_config(tmp_path, replicas=2, model={"validation": validation})
    stage = cfg.stage_of(node_id)
    module = build_stage(cfg.model, stage, 300, cfg.init_seed)
    wire, replayed = Wire(node_id), []
    ctx = NodeContext(node_id, stage, AttemptClock(), Membership(node_id), wire)

    def replay(msg: Message) -> None:
        replayed.append(msg)
        nv.on_message(msg)

    state = StageState(module, W.make_optimizer(module, 1e-3))
    nv = NodeValidation.for_node(ctx, cfg, state, 300, tmp_path, lambda: True, replay, lambda t: t)
    return nv, wire, replayed


def evaluate(nv: NodeValidation, number: int) -> None:
    nv.begin({"evaluation": number, "iteration": 4, "members": {str(k): v for k, v in MEMBERS.items()}})


def validation(sender: int, route: list[int], pos: int, h: torch.Tensor, number: int = 5) -> Message:
    meta = {"stage": 0, "evaluation": number, "route": route, "pos": pos, "pipeline": 0}
    return Message(MessageType.VALIDATION, sender, 4, 0, meta, {"activations": h})


def test_stage0_reports_the_simulator_s_loss_of_its_share_and_a_stage_relays_forward_only(
    tmp_path: Path,
) -> None:
    nodes = {n: node(tmp_path, n, validation=3) for n in (0, 2, 4, 6)}  # pipeline 0's route
    for nv, _, _ in nodes.values():
        evaluate(nv, 5)
    stage0, wire0, _ = nodes[0]
    cfg = stage0.cfg
    assert [(peer, m.microbatch, m.meta["pos"]) for peer, m in wire0] == [
        (2, 0, 1),
        (2, 2, 1),
    ]  # its share, 2 out
    reports = []
    while any(wire for _, wire, _ in nodes.values()):  # deliver every message, as the network would
        for _, wire, _ in nodes.values():
            while wire:
                peer, msg = wire.pop(0)
                if peer == SUPERVISOR_ID:
                    reports.append(msg.meta)
                else:
                    nodes[peer][0].on_message(msg)
    assert len(reports) == 1 and reports[0]["command"] == "evaluated"
    assert reports[0]["evaluation"] == 5 and reports[0]["batches"] == 2  # batches 0 and 2 of 3; node 1 has 1
    batches = validation_batches_for(cfg.model, cfg.data, 300, tmp_path)
    stages = [build_stage(cfg.model, s, 300, cfg.init_seed) for s in range(cfg.n_stages + 1)]
    with torch.no_grad():  # the simulator's loss of each batch (checkfree.pipeline.forward_loss)
        want = sum(float(forward_loss(stages, batches[i], range(1, cfg.n_stages + 1))) for i in (0, 2))
    assert reports[0]["loss_sum"] == pytest.approx(want, rel=0, abs=1e-6)
    assert all(
        p.grad is None for nv, _, _ in nodes.values() for p in nv.state.module.parameters()
    )  # no graph


@pytest.mark.parametrize(
    "route, sender, why",
    [
        ([0, 2, 4, 6], 1, "off_route"),  # the route puts node 0 before this node
        ([0, 4, 2, 6], 0, "off_route"),  # CheckFree+'s swapped order: validation visits the stages in order
        ([0, 3, 4, 6], 0, "off_route"),  # not pipeline 0's replica of stage 1
    ],
)
def test_a_validation_off_its_evaluation_s_route_is_rejected(tmp_path: Path, route, sender, why) -> None:
    nv, sent, _ = node(tmp_path, 2)
    evaluate(nv, 5)
    with pytest.raises(Rejected) as err:
        nv.on_message(validation(sender, route, 1, torch.zeros(4, 16, 32)))
    assert err.value.counter == why and sent == []


def test_nan_activations_are_rejected_and_an_early_evaluation_waits_for_its_evaluate(tmp_path: Path) -> None:
    nv, sent, replayed = node(tmp_path, 2)
    evaluate(nv, 5)
    bad = torch.zeros(4, 16, 32)
    bad[0, 0, 0] = math.nan
    with pytest.raises(Rejected) as err:
        nv.on_message(validation(0, [0, 2, 4, 6], 1, bad))
    assert err.value.counter == "nonfinite"
    nv.on_message(validation(0, [0, 2, 4, 6], 1, torch.zeros(4, 16, 32), number=4))  # an older one: dropped
    early = validation(0, [0, 2, 4, 6], 1, torch.zeros(4, 16, 32), number=9)
    nv.on_message(early)  # its evaluate is still on its way
    assert sent == [] and replayed == []
    evaluate(nv, 9)
    assert replayed == [early] and [(peer, m.meta["pos"], m.meta["evaluation"]) for peer, m in sent] == [
        (4, 2, 9)
    ]


def test_a_replayed_evaluate_is_refused_and_the_evaluation_goes_on_where_it_was(tmp_path: Path) -> None:
    nv, sent, _ = node(tmp_path, 0, validation=5)  # stage 0's share: batches 0, 2, 4; two out at once
    evaluate(nv, 5)
    assert [m.microbatch for _, m in sent] == [0, 2] and nv.queue == [4]
    nv.loss_sum, nv.count = 3.5, 1  # mid-way: one batch is back
    with pytest.raises(ProtocolError, match="evaluate 5; this node is at evaluation 5 already"):
        evaluate(nv, 5)
    with pytest.raises(ProtocolError, match="evaluate 4"):
        evaluate(nv, 4)
    assert [m.microbatch for _, m in sent] == [0, 2]  # nothing sent twice
    assert (nv.queue, sorted(nv.out), nv.loss_sum, nv.count) == ([4], [0, 2], 3.5, 1)  # nothing restarted
