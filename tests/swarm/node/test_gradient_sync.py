"""The swarm's data-parallel gradient exchange (docs/paper.md §8) between three replicas of one stage, over the real wire
format: every replica ends with the bit-identical *average* of the replicas' gradients, records ω before
clipping, steps with the clipped gradient and reports both to the supervisor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from checkfree.pipeline import clip_coefficient
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.gradient_sync import GradientSync
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError, decode, encode

STAGE, REPLICAS, MB_COUNT = 2, (5, 6, 7), 2


class FakeNode:
    """One replica: the small state a GradientSync gets; messages go through encode/decode to the peers."""

    def __init__(
        self,
        node_id: int,
        swarm: dict[int, FakeNode],
        grad_clip: float,
        microbatches: int,
        slots: tuple[int, ...] = REPLICAS,
    ):
        self.id, self.attempt = node_id, 3
        self.swarm, self.to_supervisor, self.refused = swarm, [], []
        self.module = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
        gen = torch.Generator().manual_seed(node_id)
        for p in self.module.parameters():
            p.grad = torch.randn(p.shape, generator=gen) * 0.37  # sums depend on their order in float32
        state = StageState(self.module, torch.optim.Adam(self.module.parameters()))
        membership = Membership(node_id, members={STAGE: list(slots)})  # the serving replicas by slot
        cfg = SimpleNamespace(
            mb_count=MB_COUNT, replicas=len(REPLICAS), model=SimpleNamespace(grad_clip=grad_clip)
        )
        ctx = NodeContext(
            node_id, STAGE, AttemptClock(attempt=self.attempt, iteration=17), membership, self.send
        )
        self.sync = GradientSync(ctx, state, cfg, lambda: microbatches)

    def send(self, peer, mtype, iteration=-1, microbatch=-1, meta=None, tensors=None) -> None:
        meta = {"stage": STAGE, **(meta or {})}
        msg = decode(encode(Message(mtype, self.id, iteration, microbatch, meta, tensors or {}), copy=True))
        if peer == SUPERVISOR_ID:
            self.to_supervisor.append(msg)
            return
        try:
            self.swarm[peer].sync.on_gradients(msg)
        except ProtocolError as exc:  # the peer drops and counts it, as a node's dispatch does
            self.swarm[peer].refused.append(str(exc))


def exchange(
    grad_clip: float, microbatches: tuple[int, ...] = (MB_COUNT,) * 3, slots: tuple[int, ...] = REPLICAS
) -> dict[int, FakeNode]:
    swarm: dict[int, FakeNode] = {}
    for node_id, mbs in zip(REPLICAS, microbatches, strict=True):
        swarm[node_id] = FakeNode(node_id, swarm, grad_clip, mbs, slots)
    own = {n: [p.grad.clone() for p in node.module.parameters()] for n, node in swarm.items()}
    for node in swarm.values():
        node.own = own[node.id]
    for node in swarm.values():  # 5 sends first, so 6 and 7 see their peers' gradients in another order
        node.sync.start()
    return swarm


def test_replicas_sum_in_slot_order_not_node_id_order():
    """A replacement takes its slot's place in the sum, not its new node id's (issue 39 point 2): the stage's
    serving replicas are listed by slot (7 before 5 here, as when node 7 replaced slot 0's node), and every
    replica's average is the sum in that order, bit for bit."""
    slots = (7, 5, 6)
    swarm = exchange(grad_clip=1e9, slots=slots)
    differs = 0
    for i, p in enumerate(swarm[5].module.parameters()):
        in_slots = torch.zeros_like(p)
        for n in slots:
            in_slots += swarm[n].own[i]
        in_ids = torch.zeros_like(p)
        for n in sorted(slots):
            in_ids += swarm[n].own[i]
        for node in swarm.values():
            assert torch.equal(list(node.module.parameters())[i].grad, in_slots / 3.0)
        differs += not torch.equal(in_slots, in_ids)
    assert differs > 0  # the two orders give other bits: the test tells them apart


@pytest.mark.parametrize(
    "microbatches, pipelines",
    [((2, 2, 2), 3.0), ((2, 1, 2), 2.5)],  # a pipeline that lost a microbatch counts for half
)
def test_replicas_average_the_gradients_bit_identically(microbatches, pipelines):
    swarm = exchange(grad_clip=1e9, microbatches=microbatches)  # no clipping: the average itself
    grads = {n: [p.grad for p in node.module.parameters()] for n, node in swarm.items()}
    for i in range(len(grads[5])):
        total = sum(node.own[i] for node in swarm.values())
        assert torch.allclose(grads[5][i], total / pipelines, rtol=1e-6, atol=0)
        assert torch.equal(grads[5][i], grads[6][i]) and torch.equal(grads[5][i], grads[7][i])
    for node in swarm.values():
        (ready,) = node.to_supervisor
        assert ready.meta["command"] == "ready" and ready.meta["attempt"] == 3
        assert ready.meta["pipelines"] == pytest.approx(pipelines)


def test_omega_is_the_norm_of_the_average_before_clipping_and_the_step_uses_the_clipped_one():
    clip = 0.05
    swarm = exchange(grad_clip=clip)
    node = swarm[6]
    mean = [sum(n.own[i] for n in swarm.values()) / 3 for i in range(len(node.own))]
    omega = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in mean])))
    assert omega > 10 * clip  # clipping is active
    assert node.sync.norm == pytest.approx(omega, rel=1e-6)
    assert node.to_supervisor[0].meta["grad_norm"] == pytest.approx(omega, rel=1e-6)
    coefficient = clip_coefficient(omega, clip)
    for p, g in zip(node.module.parameters(), mean, strict=True):
        assert torch.allclose(p.grad, g * coefficient, rtol=1e-5, atol=0)


def test_gradients_of_another_stage_sender_or_attempt_change_nothing():
    """Another stage's or a non-replica's gradients are refused (ProtocolError: the node drops and counts the
    message); a stale attempt's are ignored. Nothing is kept and no gradient changes."""
    swarm = exchange(grad_clip=1e9)
    node = swarm[5]
    before = [p.grad.clone() for p in node.module.parameters()]
    node.sync.reset()
    node.sync.attempt = node.attempt  # a sync of this attempt is under way; foreign gradients arrive
    stray = {f"g.{n}": torch.ones_like(p) for n, p in node.module.named_parameters()}
    for meta, sender in (({"stage": STAGE + 1, "attempt": 3}, 6), ({"stage": STAGE, "attempt": 3}, 9)):
        with pytest.raises(ProtocolError, match="not a replica"):
            node.sync.on_gradients(Message(MessageType.GRADIENTS, sender, 17, -1, meta, stray))
    node.sync.on_gradients(Message(MessageType.GRADIENTS, 6, 17, -1, {"stage": STAGE, "attempt": 2}, stray))
    assert node.sync.received == {} and all(
        torch.equal(p.grad, b) for p, b in zip(node.module.parameters(), before, strict=True)
    )


def test_a_replica_that_ran_no_microbatch_cannot_add_gradients_of_any_size():
    """Node 6 claims 0 microbatches but sends gradients 10^6 times an honest one's: its contribution is dropped
    (the bound per microbatch cannot judge a contribution of 0 microbatches), and the honest replicas average
    their own two pipelines alone and name node 6 to the supervisor."""
    swarm: dict[int, FakeNode] = {}
    for node_id, mbs in zip(REPLICAS, (MB_COUNT, 0, MB_COUNT), strict=True):
        swarm[node_id] = FakeNode(node_id, swarm, 1e9, mbs)
    for p in swarm[6].module.parameters():
        p.grad *= 1e6  # finite, and far beyond what an honest replica sends
    own = {n: [p.grad.clone() for p in node.module.parameters()] for n, node in swarm.items()}
    for node in swarm.values():
        node.sync.start()
    for n in (5, 7):
        node = swarm[n]
        for p, a, b in zip(node.module.parameters(), own[5], own[7], strict=True):
            assert torch.allclose(p.grad, (a + b) / 2, rtol=1e-6, atol=0)
        (ready,) = node.to_supervisor
        assert ready.meta["rejected"] == [6] and ready.meta["pipelines"] == pytest.approx(2.0)
        assert [r for r in node.refused if "ran no microbatch" in r], node.refused
