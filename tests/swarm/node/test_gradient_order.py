"""A node sums its microbatches' parameter gradients in an order fixed by microbatch id, never by the order their
messages arrive in (checkfree.swarm.node.compute.OrderedGradients; issue 39 point 2): the same microbatches
arriving in another order give bit-identical ``.grad``, with at most ``in_flight − 1`` held at once."""

from __future__ import annotations

import copy

import torch

from checkfree.config import load_config
from checkfree.swarm.node.compute import StageWorker, build_stage

CFG = load_config("tiny_config.json", {"dmodel": 32, "num_heads": 2, "seq_l": 8, "batch_size": 2})
VOCAB = 64
SWAPPED = [1, 0, 3, 2]
"""The backward order of a pipeline with ``in_flight`` 2 whose odd microbatches take a faster route."""


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in module.named_parameters()}


def _differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    return sum(not torch.equal(a[n], b[n]) for n in a)


def _relay(
    order: list[tuple[int, int]], seed: int = 3
) -> tuple[StageWorker, dict[tuple[int, int], torch.Tensor]]:
    """A stage-1 worker that ran the forward of every key in id order and the backward in ``order`` → the worker
    (settled) and each key's input gradient."""
    torch.manual_seed(0)
    worker = StageWorker(build_stage(CFG, 1, VOCAB, seed=1), 1)
    gen = torch.Generator().manual_seed(seed)
    inputs = {k: torch.randn(2, 8, 32, generator=gen) for k in sorted(order)}
    outputs = {k: torch.randn(2, 8, 32, generator=gen) for k in sorted(order)}
    for k in sorted(order):
        worker.forward(k, inputs[k])
    gx = {k: worker.backward(k, outputs[k]) for k in order}
    worker.settle()
    return worker, gx


def test_a_transformer_stage_sums_in_microbatch_order_whatever_the_backward_order() -> None:
    in_order, _ = _relay([(0, mb) for mb in range(4)])
    swapped, gx = _relay([(0, mb) for mb in SWAPPED])
    assert _differ(_grads(in_order.module), _grads(swapped.module)) == 0
    assert swapped.gradients.peak_held == 1 and in_order.gradients.peak_held == 0  # in_flight − 1
    assert swapped.microbatches == 4
    # the arrival-order sum (what .backward() accumulates) gives other bits: the test tells them apart
    ref = copy.deepcopy(in_order.module)
    ref.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(3)
    inputs = [torch.randn(2, 8, 32, generator=gen) for _ in range(4)]
    outputs = [torch.randn(2, 8, 32, generator=gen) for _ in range(4)]
    ref.load_state_dict(build_stage(CFG, 1, VOCAB, seed=1).state_dict())
    saved = {}
    for mb in range(4):
        x = inputs[mb].clone().requires_grad_()
        saved[mb] = (x, ref(x))
    for mb in SWAPPED:
        saved[mb][1].backward(outputs[mb])
        assert torch.equal(saved[mb][0].grad, gx[(0, mb)])  # the input gradients are the plain backward's
    assert _differ(_grads(ref), _grads(swapped.module)) > 0


def test_pipelines_through_one_node_add_in_pipeline_order() -> None:
    """A stage short of replicas carries several pipelines: their microbatches interleave in any order (microbatch
    2 may come back before 1 with ``in_flight`` 2)."""
    one, _ = _relay([(p, mb) for mb in range(3) for p in range(3)])
    order = [(2, 0), (2, 2), (1, 0), (2, 1), (1, 1), (0, 0), (1, 2), (0, 2), (0, 1)]
    other, _ = _relay(order)
    assert _differ(_grads(one.module), _grads(other.module)) == 0


def _stage0(head_order: list[int], embed_order: list[int]) -> StageWorker:
    worker = StageWorker(build_stage(CFG, 0, VOCAB, seed=1), 0)
    gen = torch.Generator().manual_seed(5)
    ids = [torch.randint(0, VOCAB, (2, 8), generator=gen) for _ in range(4)]
    labels = [torch.randint(0, VOCAB, (2, 8), generator=gen) for _ in range(4)]
    finals = [torch.randn(2, 8, 32, generator=gen) for _ in range(4)]
    for mb in range(4):
        worker.embed((0, mb), ids[mb])
    back = {mb: worker.head_loss((0, mb), finals[mb], labels[mb], 4)[1] for mb in head_order}
    for mb in embed_order:
        assert worker.embed_backward((0, mb), back[mb] * 0.5)
    worker.settle()
    return worker


def test_stage_0_sums_its_head_and_embedding_gradients_in_microbatch_order() -> None:
    a = _stage0(list(range(4)), list(range(4)))
    b = _stage0(SWAPPED, [0, 2, 1, 3])
    assert _differ(_grads(a.module), _grads(b.module)) == 0
    assert all(p.grad is not None for p in b.module.parameters())


def test_a_replayed_sync_keeps_the_settled_gradients_and_a_reset_drops_the_held_ones() -> None:
    worker, _ = _relay([(0, mb) for mb in SWAPPED])
    before = {n: g.clone() for n, g in _grads(worker.module).items()}
    worker.settle()  # a second ``sync`` of the attempt
    assert _differ(before, _grads(worker.module)) == 0
    worker.reset()  # the next attempt
    worker.forward((0, 0), torch.randn(2, 8, 32))
    worker.forward((0, 1), torch.randn(2, 8, 32))
    worker.backward((0, 1), torch.randn(2, 8, 32))  # held: microbatch 0 has not come
    worker.reset()  # the attempt is aborted
    assert not worker.gradients.chains and all(p.grad is None for p in worker.module.parameters())
