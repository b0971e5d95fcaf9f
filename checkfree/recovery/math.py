"""The pure recovery math: state dicts (or tensors) and scalars in, state dicts out; no sockets, process groups or
files. The one table of recovery rules (checkfree/recovery/rules.py), which the simulator's strategies and swarm
nodes (checkfree/swarm/node/recovering.py) both execute, rebuilds lost stages with these functions, so the two
give the same weights for the same inputs.

Paper §4.1 (CheckFree, Eq. 2: the ω-weighted average of the two neighbours), §4.2 (CheckFree+: stage 0 from the
copies of E and E⁻¹), and the ablations of Fig. 2 (Copy, Average, Zero, Random).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from checkfree.model import MLP_OUT_SUFFIXES
from checkfree.pipeline import clip_coefficient
from checkfree.training_state import StateDict


def checkfree_weight(norm: float, max_norm: float, mode: str) -> float:
    """The CheckFree weight ω of a stage from its last gradient norm (paper §4.1, docs/paper.md §2).

    mode "paper": ω = ‖∇‖ (unclipped). mode "clipped": the release's ω = ‖∇‖ after per-stage clipping + 1e-4.
    """
    if mode == "paper":
        return norm
    if mode == "clipped":
        return norm * clip_coefficient(norm, max_norm) + 1e-4
    raise ValueError(f"grad_norm_mode is {mode!r}; expected 'paper' or 'clipped'.")


def checkfree_shares(w_left: float, w_right: float) -> tuple[float, float]:
    """The coefficients ω_{i−1}/(ω_{i−1} + ω_{i+1}) and ω_{i+1}/(ω_{i−1} + ω_{i+1}) of Eq. 2 (paper §4.1).

    Both weights are first divided by the larger one, so the sum cannot overflow (1e308 + 1e308 would be inf
    and give 0/0 shares); the shares always add up to 1. If both weights are 0 the shares are 0.5 and 0.5.

    Raises:
        ValueError: a weight is negative or not finite.
    """
    for w in (w_left, w_right):
        if not (w >= 0.0 and w < float("inf")):
            raise ValueError(f"CheckFree weight {w!r} is invalid; expected a finite number ≥ 0.")
    largest = max(w_left, w_right)
    if largest == 0:
        return 0.5, 0.5
    left, right = w_left / largest, w_right / largest  # in [0, 1], one of them exactly 1
    return left / (left + right), right / (left + right)


def weighted_average(
    left: Mapping[str, torch.Tensor], right: Mapping[str, torch.Tensor], w_left: float, w_right: float
) -> StateDict:
    """CheckFree rule (paper §4.1, Eq. 2): W_i = (ω_{i−1}·W_{i−1} + ω_{i+1}·W_{i+1}) / (ω_{i−1} + ω_{i+1}).

    Applied to every tensor; both state dicts must have the same keys and shapes. If both weights are 0 the
    result is the plain average. The coefficients come from :func:`checkfree_shares` (no overflow).

    Raises:
        ValueError: keys or shapes differ, or a weight is negative or not finite.
    """
    if left.keys() != right.keys():
        raise ValueError(f"neighbour state dicts differ in keys: {sorted(set(left) ^ set(right))[:4]}.")
    a, b = checkfree_shares(w_left, w_right)
    out: StateDict = {}
    for k, t in left.items():
        u = right[k]
        if t.shape != u.shape:
            raise ValueError(f"neighbour tensor {k!r} has shapes {tuple(t.shape)} and {tuple(u.shape)}.")
        out[k] = (a * t + b * u).to(t.dtype) if t.is_floating_point() else t.clone()
    return out


def average(left: Mapping[str, torch.Tensor], right: Mapping[str, torch.Tensor]) -> StateDict:
    """Uniform average of the two neighbours ("Average" in the paper's Fig. 2)."""
    return weighted_average(left, right, 1.0, 1.0)


def copy_state(source: Mapping[str, torch.Tensor]) -> StateDict:
    """A detached copy ("Copy" in the paper's Fig. 2)."""
    return {k: v.detach().clone() for k, v in source.items()}


def zero_mlp_output(state: Mapping[str, torch.Tensor], architecture: str) -> StateDict:
    """Copy ``state`` and zero every block's MLP output projection, so each MLP starts as identity-residual."""
    suffixes = MLP_OUT_SUFFIXES[architecture]
    return {k: torch.zeros_like(v) if k.endswith(suffixes) else v.detach().clone() for k, v in state.items()}


def random_state(
    template: Mapping[str, torch.Tensor], generator: torch.Generator, std: float = 0.02
) -> StateDict:
    """Fresh initialisation shaped like ``template``: matrices ~ N(0, std), norm gains 1, biases 0 ("Random")."""
    out: StateDict = {}
    for k, v in template.items():
        if v.dim() >= 2:
            out[k] = torch.randn(v.shape, generator=generator, dtype=torch.float32).mul_(std).to(v.dtype)
        elif k.endswith("weight") and ("norm" in k or "ln_" in k):
            out[k] = torch.ones_like(v)
        else:
            out[k] = torch.zeros_like(v)
    return out


def is_consecutive(stage: int, failed: Iterable[int]) -> bool:
    """A directly adjacent stage (stage 0 included) failed in the same iteration."""
    lost = set(failed)
    return (stage - 1) in lost or (stage + 1) in lost


def recovery_seed(seed: int, iteration: int, stage: int) -> int:
    """Seed of the generator for a random re-initialisation: the same on every rank and for every run."""
    return (seed * 1_000_003 + iteration * 10_007 + stage) % (2**63)


def random_init(
    template: Mapping[str, torch.Tensor], seed: int, iteration: int, stage: int, std: float = 0.02
) -> StateDict:
    """The "random" rule: :func:`random_state` shaped like ``template``, from a generator seeded with
    :func:`recovery_seed` (``seed``, ``iteration`` of the loss event, ``stage``), so the simulator and a swarm
    replacement draw the same numbers for the same loss event."""
    gen = torch.Generator().manual_seed(recovery_seed(seed, iteration, stage))
    return random_state(template, gen, std)


STAGE0_EMBED_PREFIXES = ("embed_tokens.", "positions.")
"""Stage-0 state-dict keys of the embedding E (token and, for GPT, position tables); every other key is E⁻¹."""


def stage0_part(key: str) -> str:
    """Which CheckFree+ copy holds stage-0 entry ``key``: "embedding" (E) or "head" (final norm + LM head, E⁻¹)."""
    return "embedding" if key.startswith(STAGE0_EMBED_PREFIXES) else "head"


def stage0_from_copies(
    template: Mapping[str, torch.Tensor],
    copies: Mapping[str, torch.Tensor],
    parts: Iterable[str],
    seed: int,
    iteration: int,
    std: float = 0.02,
) -> StateDict:
    """Stage 0 under CheckFree+ (paper §4.2): the entries of each part in ``parts`` from ``copies`` (E held by
    stage 1, E⁻¹ by stage S); a part whose holder is lost too gets :func:`random_init` of stage 0 (the planner's
    fallback). ``template``: stage 0's state dict (keys, shapes, dtypes; its values are not used)."""
    kept = set(parts)
    new: StateDict = {}
    fresh = None
    for k in template:
        if stage0_part(k) in kept:
            new[k] = copies[k].detach().clone()
        else:
            if fresh is None:
                fresh = random_init(template, seed, iteration, 0, std)
            new[k] = fresh[k]
    return new
