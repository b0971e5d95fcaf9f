"""Recovery from neighbouring stages: CheckFree, CheckFree+ and the paper's ablations (Copy, Average, Zero, Random).

Registered strategies that execute the planner's plans (checkfree/recovery/planner.py) on a
:class:`~checkfree.training_state.TrainingState` with the pure math of checkfree/recovery/math.py (which swarm
nodes use too).

Neighbours of a failed transformer stage i are the nearest *surviving* transformer stages on each side
(i−1 and i+1 unless those failed in the same iteration too; stage 0 is never a neighbour, its shapes differ).
A stage whose rule cannot apply (e.g. one neighbour only) uses a documented fallback, recorded in the metrics.
"""

from __future__ import annotations

import logging
import time

import torch

from checkfree.recovery import planner
from checkfree.recovery.base import RecoveryRecord, RecoveryStrategy
from checkfree.recovery.math import (
    average,
    checkfree_shares,
    checkfree_weight,
    copy_state,
    is_consecutive,
    random_init,
    stage0_from_copies,
    weighted_average,
    zero_mlp_output,
)
from checkfree.recovery.planner import RecoveryPlan
from checkfree.training_state import StateDict, TrainingState

log = logging.getLogger(__name__)


class NoFailure(RecoveryStrategy):
    """``no_failure``: failures are drawn and logged, nothing is lost (the reference curve)."""

    name = "no_failure"

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
    copies = strategy.stage0_copy
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

    def setup(self, state: TrainingState) -> None:
        self.stage0_copy = state.stage_state(0)

    def after_step(self, state: TrainingState) -> None:
        with torch.no_grad():
            for k, v in state.stages[0].state_dict().items():
                self.stage0_copy[k].copy_(v)

    def stats(self) -> dict:
        copy = self.stage0_copy or {}
        return {"extra_memory_bytes": sum(t.numel() * t.element_size() for t in copy.values())}
