"""Stage order per microbatch, the staged forward/backward, and per-stage gradient norms.

CheckFree+ (paper §4.2) runs the pipeline *out of order* on odd microbatches: the first two transformer stages
swap (E, S2, S1, S3, …) and so do the last two (…, S_{S−2}, S_S, S_{S−1}, E⁻¹). Each of S1 and S2 then learns to
stand in for the other, as do S_{S−1} and S_S, so a lost first or last stage can be replaced by a copy of its
partner. The swaps need two disjoint pairs, hence S ≥ 4; with S < 4 :func:`stage_order` raises.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from checkfree.loss import head_loss

MIN_STAGES_FOR_SWAPS = 4


def stage_order(microbatch: int, n_stages: int, swaps: bool) -> list[int]:
    """Transformer stages (1..S) in the order microbatch ``microbatch`` visits them.

    Even microbatches, or ``swaps=False``: [1, 2, …, S]. Odd microbatches with swaps: [2, 1, 3, …, S−2, S, S−1]
    (paper §4.2). Raises ValueError when swaps are asked for with S < 4.
    """
    if n_stages < 1:
        raise ValueError(f"n_stages is {n_stages}; expected at least 1 transformer stage.")
    order = list(range(1, n_stages + 1))
    if not swaps:
        return order
    if n_stages < MIN_STAGES_FOR_SWAPS:
        raise ValueError(
            f"CheckFree+ swaps need n_stages ≥ {MIN_STAGES_FOR_SWAPS} (two disjoint pairs of stages "
            f"to swap), got {n_stages}; run without swaps (run_2.sh) or use more stages."
        )
    if microbatch % 2 == 1:
        order[0], order[1] = order[1], order[0]
        order[-1], order[-2] = order[-2], order[-1]
    return order


def forward_loss(
    stages: Sequence[nn.Module], batch: torch.Tensor, order: Iterable[int], fused: bool = False
) -> torch.Tensor:
    """Token-mean cross-entropy (nats) of one microbatch run through ``stages`` in ``order``.

    Args:
        stages: [stage 0, stage 1, …, stage S] (see checkfree.model).
        batch: (B, T+1) int64 token ids; inputs are ``batch[:, :-1]``, labels ``batch[:, 1:]``.
        order: transformer stages to visit, e.g. from :func:`stage_order`.
        fused: the head and loss through Liger-Kernel's fused linear cross-entropy (CUDA; the trainer's
            ``--fused-loss``), else the plain path; :func:`checkfree.loss.head_loss` either way.
    """
    inputs, labels = batch[:, :-1], batch[:, 1:]
    h = stages[0].embed(inputs)  # (B, T, d)
    for s in order:
        h = stages[s](h)  # (B, T, d)
    return head_loss(stages[0], h, labels, fused)


def grad_norm(module: nn.Module) -> float:
    """L2 norm of all gradients of ``module`` (0.0 when it has none). Note: a device-host sync point."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor torch.nn.utils.clip_grad_norm_ scales gradients by: min(1, max_norm / (norm + 1e-6))."""
    return min(1.0, max_norm / (norm + 1e-6))


def scale_grads(module: nn.Module, factor: float) -> None:
    """Multiply every gradient of ``module`` in place by ``factor`` (skipped when factor == 1)."""
    if factor == 1.0:
        return
    for p in module.parameters():
        if p.grad is not None:
            p.grad.mul_(factor)


def perplexity(loss_nats: float) -> float:
    """exp(loss) with overflow mapped to inf."""
    return math.exp(loss_nats) if loss_nats < 700 else math.inf
