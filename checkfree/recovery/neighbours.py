"""Recovery from neighbouring stages: CheckFree, CheckFree+ and the paper's ablations (Copy, Average, Zero, Random).

The first half is pure math on state dicts (used by the simulator and by swarm nodes alike); the second half wraps
it into registered strategies that act on a :class:`~checkfree.training_state.TrainingState`.

Neighbours of a failed transformer stage i are the nearest *surviving* transformer stages on each side
(i−1 and i+1 unless those failed in the same iteration too; stage 0 is never a neighbour, its shapes differ).
A stage whose rule cannot apply (e.g. one neighbour only) uses a documented fallback, recorded in the metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

import torch

from checkfree.model import MLP_OUT_SUFFIXES
from checkfree.pipeline import checkfree_weight
from checkfree.recovery import planner
from checkfree.recovery.base import RecoveryRecord, RecoveryStrategy
from checkfree.recovery.planner import RecoveryPlan, live_neighbours, stage0_copy_holders  # noqa: F401
from checkfree.training_state import StateDict, TrainingState

log = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------- pure math


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


STAGE0_EMBED_PREFIXES = ("embed_tokens.", "positions.")
"""Stage-0 state-dict keys of the embedding E (token and, for GPT, position tables); every other key is E⁻¹."""


def stage0_part(key: str) -> str:
    """Which CheckFree+ copy holds stage-0 entry ``key``: "embedding" (E) or "head" (final norm + LM head, E⁻¹)."""
    return "embedding" if key.startswith(STAGE0_EMBED_PREFIXES) else "head"


# ----------------------------------------------------------------------------------------------- strategies


class NoFailure(RecoveryStrategy):
    """``no_failure``: failures are drawn and logged, nothing is lost (the reference curve)."""

    name = "no_failure"
    loses_state = False
    recovers_stage0 = True

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        return []


class _NeighbourStrategy(RecoveryStrategy):
    """Shared loop: the planner decides each lost stage's rule and sources; this executes the plans on local
    stages, then gives each rebuilt stage a fresh Adam at lr × lr_scale."""

    planner_setting = ""
    """The planner's setting this strategy executes (its canonical name; a subclass keeps its parent's)."""

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        plans = planner.plan(failed, state.n_stages, self.planner_setting)
        records = []
        for stage in sorted(failed):
            t0 = time.perf_counter()
            new, record = self.execute(state, stage, plans[stage])
            state.load_stage(stage, new)
            state.fresh_optimizer(stage, self.cfg.lr_scale)
            record.consecutive = is_consecutive(stage, failed)
            record.seconds = time.perf_counter() - t0
            if record.consecutive:
                log.info(
                    "stage %d failed together with a neighbour; rebuilt from live stages %s",
                    stage,
                    record.sources,
                )
            records.append(record)
        return records

    def execute(
        self, state: TrainingState, stage: int, plan: RecoveryPlan
    ) -> tuple[StateDict, RecoveryRecord]:
        """The new weights of ``stage`` by ``plan`` (read from the live stages of ``state``) and its record.

        Raises:
            ValueError: a rule this strategy cannot execute (e.g. "stage0_copy" without the copies).
        """
        try:
            rule = _RULES[plan.rule]
        except KeyError:
            raise ValueError(f"strategy {self.name!r} cannot execute rule {plan.rule!r}.") from None
        new, shares, extra = rule(self, state, stage, plan)
        record = RecoveryRecord(
            stage, self.name, list(plan.sources), shares, rule=plan.rule, fallback=plan.fallback, extra=extra
        )
        return new, record

    def weights(self, state: TrainingState, left: int, right: int) -> tuple[float, float]:
        """ω of the two neighbours: their last gradient norms (paper §4.1), or the release's clipped variant."""
        mode, clip = self.cfg.grad_norm_mode, self.cfg.grad_clip
        return (
            checkfree_weight(state.grad_norms[left], clip, mode),
            checkfree_weight(state.grad_norms[right], clip, mode),
        )


Executed = tuple[StateDict, list[float] | None, dict]


def _copy(strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan) -> Executed:
    return copy_state(state.stage_state(plan.sources[0])), [1.0], {}


def _zero(strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan) -> Executed:
    return zero_mlp_output(state.stage_state(plan.sources[0]), strategy.cfg.architecture), [1.0], {}


def _average(strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan) -> Executed:
    left, right = plan.sources
    return average(state.stage_state(left), state.stage_state(right)), [0.5, 0.5], {}


def _checkfree(
    strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan
) -> Executed:
    left, right = plan.sources
    w_left, w_right = strategy.weights(state, left, right)
    new = weighted_average(state.stage_state(left), state.stage_state(right), w_left, w_right)
    extra = {"grad_norm_mode": strategy.cfg.grad_norm_mode, "omega": [w_left, w_right]}
    return new, list(checkfree_shares(w_left, w_right)), extra


def _random(strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan) -> Executed:
    template = state.stages[stage].state_dict()
    return random_init(template, strategy.seed, state.iteration, stage, strategy.cfg.init_std), None, {}


def _stage0_copy(
    strategy: _NeighbourStrategy, state: TrainingState, stage: int, plan: RecoveryPlan
) -> Executed:
    """E and E⁻¹ from the copies stages 1 and S hold; a part whose holder is lost gets a seeded random init."""
    copies = getattr(strategy, "stage0_copy", None)
    if copies is None:
        raise ValueError(f"strategy {strategy.name!r} keeps no stage-0 copies.")
    template = state.stages[0].state_dict()
    seed, std = strategy.seed, strategy.cfg.init_std
    return stage0_from_copies(template, copies, plan.parts, seed, state.iteration, std), None, {}


_RULES = {
    "copy": _copy,
    "zero": _zero,
    "average": _average,
    "checkfree": _checkfree,
    "random": _random,
    "stage0_copy": _stage0_copy,
}
"""Plan rule → its execution on local stages (the swarm executes the same rules on fetched weights)."""


class Copy(_NeighbourStrategy):
    """``copy`` (ours-naive): copy stage i−1, or stage 2 for the first stage."""

    name = "copy"
    planner_setting = "copy"


class RandomInit(_NeighbourStrategy):
    """``random`` (ours-random): a fresh N(0, init_std) initialisation."""

    name = "random"
    planner_setting = "random"


class Zero(_NeighbourStrategy):
    """``zero`` (ours-zero): copy a neighbour, then zero each block's MLP output projection."""

    name = "zero"
    planner_setting = "zero"


class Average(_NeighbourStrategy):
    """``average`` (ours-avg-ablation): uniform 0.5/0.5 average of the two neighbours."""

    name = "average"
    planner_setting = "average"


class CheckFree(_NeighbourStrategy):
    """``checkfree`` (ours-grad-avg without swaps): gradient-norm-weighted average of the neighbours (§4.1).

    The first and last stages have one neighbour only; CheckFree cannot recover them, so it falls back to a copy
    of that neighbour (recorded as a fallback).
    """

    name = "checkfree"
    planner_setting = "checkfree"


class CheckFreePlus(CheckFree):
    """``checkfree_plus`` (ours-grad-avg with swaps, §4.2).

    With out-of-order execution the first stage is replaced by a copy of the second and the last by a copy of the
    second-to-last; other stages use the CheckFree rule. Stage 0 (embedding E and head E⁻¹) is restored exactly
    from the copies its neighbours hold: stage 1 keeps E, stage S keeps E⁻¹, refreshed after every step.
    """

    name = "checkfree_plus"
    planner_setting = "checkfree_plus"
    recovers_stage0 = True
    requires_swaps = True

    def setup(self, state: TrainingState) -> None:
        self.stage0_copy = state.stage_state(0)

    def after_step(self, state: TrainingState) -> None:
        with torch.no_grad():
            for k, v in state.stages[0].state_dict().items():
                self.stage0_copy[k].copy_(v)

    def stats(self) -> dict:
        copy = getattr(self, "stage0_copy", {})
        return {"extra_memory_bytes": sum(t.numel() * t.element_size() for t in copy.values())}
