"""A replica's death mid-attempt re-routes only the pipelines that crossed it (issue 39 point 1;
checkfree.swarm.reroute): the routes of the others stay put, the route check takes exactly the new routes, a
re-sent microbatch's parameter gradient is not added twice, and the stage adds one contribution per pipeline in
pipeline order whichever replica carried it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from checkfree.pipeline import stage_order
from checkfree.swarm.config import route
from checkfree.swarm.node.compute import StageWorker
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.gradient_sync import GradientSync
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.relay import check_route
from checkfree.swarm.reroute import carried, moved, node_of, stable_route
from checkfree.swarm.wire.protocol import (
    SUPERVISOR_ID,
    Message,
    MessageType,
    ProtocolError,
    Rejected,
    decode,
    encode,
)

BEGUN = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8], 3: [9, 10, 11]}
"""3 pipelines, 3 stages of 3 replicas (node ids by slot)."""


def _without(members: dict[int, list[int]], *dead: int) -> dict[int, list[int]]:
    return {s: [n for n in ids if n not in dead] for s, ids in members.items()}


def test_a_death_moves_only_the_pipeline_that_crossed_it() -> None:
    after = _without(BEGUN, 4)  # stage 1's second replica: pipeline 1's node there
    order = [1, 2, 3]
    for p in range(3):  # with nobody dead the routes are config.route's
        assert stable_route(p, BEGUN, BEGUN, 3, order) == route(p, BEGUN, 3, order)
    assert stable_route(0, BEGUN, after, 3, order) == [0, 3, 6, 9]  # kept: node 3 still serves
    assert stable_route(2, BEGUN, after, 3, order) == [2, 5, 8, 11]  # kept
    assert stable_route(1, BEGUN, after, 3, order) == [1, 5, 7, 10]  # substitute: serving[1 % 2] = 5
    assert moved(BEGUN, BEGUN, after, 3) == [1]
    assert carried(5, 1, BEGUN, after) == [1, 2] and carried(3, 1, BEGUN, after) == [0]
    # a second death in the same attempt: pipeline 2's node at stage 3; pipeline 1's substitute stays
    again = _without(after, 11)
    assert moved(BEGUN, after, again, 3) == [2]
    assert node_of(2, 3, BEGUN, again) == 9 and node_of(1, 1, BEGUN, again) == 5
    assert stable_route(0, BEGUN, _without(BEGUN, 3, 4, 5), 3, order) is None  # a whole stage lost


def _msg(kind: MessageType, sender: int, path: list[int], pos: int, pipeline: int) -> Message:
    meta = {"stage": 1, "attempt": 1, "route": path, "pos": pos, "pipeline": pipeline}
    return Message(kind, sender, 0, 2, meta)


def test_after_a_reroute_the_route_check_takes_the_new_route_and_refuses_the_old_one() -> None:
    """Node 7 (stage 2) after node 4 died: pipeline 1's FORWARD now comes from the substitute 5; one still on
    the old route (from node 4, sent before it died) is refused ``off_route`` (the node counts it), and pipeline
    0's route, which did not move, still passes."""
    cfg = SimpleNamespace(n_stages=3, mb_count=4)
    membership = Membership(7, members={s: list(ids) for s, ids in BEGUN.items()})
    membership.rerouted({str(s): ids for s, ids in _without(BEGUN, 4).items()})
    begun, now = membership.at_begin(), membership.members
    order = stage_order(2, 3, False)
    new, old = [1, 5, 7, 10], [1, 4, 7, 10]
    check_route(_msg(MessageType.FORWARD, 5, new, 2, 1), new, 2, cfg, now, False, 7, begun)
    with pytest.raises(Rejected) as err:
        check_route(_msg(MessageType.FORWARD, 4, old, 2, 1), old, 2, cfg, now, False, 7, begun)
    assert err.value.counter == "off_route"
    kept = stable_route(0, begun, now, 3, order)
    assert kept == [0, 3, 6, 9]
    check_route(_msg(MessageType.BACKWARD, 9, kept, 2, 0), kept, 2, cfg, now, False, 6, begun)
    with pytest.raises(ProtocolError, match="adds nodes"):
        membership.rerouted({"1": [3, 4, 5]})  # a re-route only takes nodes out


def test_a_resent_microbatch_runs_again_but_adds_its_parameter_gradient_once() -> None:
    """Microbatches 0 and 1 of pipeline 0 ran; the pipeline is re-routed and both are sent again (the same
    inputs: the same weights give the same bits). The copies' input gradients are the originals', and the
    stage's sum is that of one copy each; a third FORWARD of one microbatch is still refused."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 3, 8, generator=gen) for _ in range(3)]
    gs = [torch.randn(2, 3, 8, generator=gen) for _ in range(3)]
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    once = StageWorker(module, 1)
    for mb in range(3):
        once.forward((0, mb), xs[mb])
        once.backward((0, mb), gs[mb])
    once.settle()
    want = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)

    worker = StageWorker(module, 1)
    first = []
    for mb in range(2):
        worker.forward((0, mb), xs[mb])
        first.append(worker.backward((0, mb), gs[mb]))
    worker.forget([0])  # the re-route
    for mb in range(3):
        worker.forward((0, mb), xs[mb])
        gx = worker.backward((0, mb), gs[mb])
        if mb < 2:
            assert torch.equal(gx, first[mb])
    with pytest.raises(ProtocolError, match="came twice"):
        worker.forward((0, 1), xs[1])
    worker.settle()
    for n, p in module.named_parameters():
        assert torch.equal(p.grad, want[n]), n
    assert worker.settled[0][1] == 3 and worker.duplicates == 2


def test_a_replica_carrying_two_pipelines_sends_each_and_the_stage_adds_them_in_pipeline_order() -> None:
    """Stage 1 after node 5 died: node 3 carries pipelines 0 and 2 (substitute: serving[2 mod 2]), node 4
    pipeline 1. Both end with (c0 + c1 + c2) / 3 bit for bit, as a swarm where each replica carried its own
    pipeline; adding each node's own sum in node order ((c0 + c2) then c1) gives other bits. A contribution of a
    pipeline the routes do not give its sender is dropped and the sender named."""
    shapes = {"w": (64, 64), "b": (64,)}
    gen = torch.Generator().manual_seed(3)
    chains = {p: {n: torch.randn(s, generator=gen) * 0.37 for n, s in shapes.items()} for p in range(3)}
    after = _without(BEGUN, 5)
    nodes = _stage(after, chains)
    assert carried(3, 1, BEGUN, after) == [0, 2]
    for node in nodes.values():
        node.sync.start()
    want = {n: (torch.zeros(s) + chains[0][n] + chains[1][n] + chains[2][n]) / 3.0 for n, s in shapes.items()}
    by_node = {n: torch.zeros(s) + (chains[0][n] + chains[2][n]) + chains[1][n] for n, s in shapes.items()}
    assert any(not torch.equal(want[n], by_node[n] / 3.0) for n in shapes)  # the orders differ in bits
    for node in nodes.values():
        (ready,) = node.to_supervisor
        assert ready.meta["pipelines"] == 3.0 and "rejected" not in ready.meta
        for n, p in node.module.named_parameters():
            assert torch.equal(p.grad, want[n]), (node.id, n)

    # node 4 sends pipeline 2 as well (node 3's): before node 3's sync it is kept, then dropped at the reduce
    # and node 4 named; after node 3's sync (the routes are final) it is refused on arrival. The sum is unchanged
    for first in (4, 3):
        nodes = _stage(after, chains)
        own = nodes[4].sync._own
        nodes[4].sync._own = lambda own=own: {2: ({n: chains[2][n] * 5 for n in shapes}, 4)} | own()
        nodes[first].sync.start()
        nodes[7 - first].sync.start()
        (ready,) = nodes[3].to_supervisor
        if first == 4:
            assert ready.meta["rejected"] == [4] and nodes[3].refused == []
        else:
            assert "rejected" not in ready.meta and "does not carry it" in nodes[3].refused[0]
        for n, p in nodes[3].module.named_parameters():
            assert torch.equal(p.grad, want[n])


def _stage(after: dict[int, list[int]], chains: dict) -> dict[int, _Replica]:
    nodes = {n: _replica(n, after, chains) for n in after[1]}
    for node in nodes.values():
        node.peers = nodes
    return nodes


class _Replica(SimpleNamespace):
    def send(self, peer, mtype, iteration=-1, microbatch=-1, meta=None, tensors=None) -> None:
        meta = {"stage": 1, **(meta or {})}
        msg = decode(encode(Message(mtype, self.id, iteration, microbatch, meta, tensors or {}), copy=True))
        if peer == SUPERVISOR_ID:
            self.to_supervisor.append(msg)
        else:
            try:
                self.peers[peer].sync.on_gradients(msg)
            except ProtocolError as exc:  # the peer drops and counts it, as a node's dispatch does
                self.peers[peer].refused.append(str(exc))


def _replica(node_id: int, after: dict[int, list[int]], chains: dict) -> _Replica:
    module = nn.Module()
    module.w = nn.Parameter(torch.zeros(64, 64))
    module.b = nn.Parameter(torch.zeros(64))
    node = _Replica(id=node_id, to_supervisor=[], refused=[], module=module)
    membership = Membership(node_id, members={s: list(ids) for s, ids in BEGUN.items()})
    membership.rerouted({str(s): ids for s, ids in after.items()})
    ctx = NodeContext(node_id, 1, AttemptClock(attempt=3, iteration=5), membership, node.send)
    cfg = SimpleNamespace(mb_count=4, replicas=3, model=SimpleNamespace(grad_clip=1e9))
    mine = carried(node_id, 1, membership.at_begin(), membership.members)
    state = StageState(module, torch.optim.Adam(module.parameters()))
    node.sync = GradientSync(ctx, state, cfg, lambda: 0, lambda: {p: (chains[p], 4) for p in mine})
    return node
