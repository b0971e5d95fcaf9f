"""Recovery from neighbouring stages: CheckFree, CheckFree+ and the paper's ablations (Copy, Average, Zero, Random).

Registered strategies that execute the planner's plans (checkfree/recovery/planner.py) on a
:class:`~checkfree.training_state.TrainingState` through the one rule table (checkfree/recovery/rules.py, which
swarm nodes execute too).

Neighbours of a failed transformer stage i are the nearest *surviving* transformer stages on each side
(i−1 and i+1 unless those failed in the same iteration too; stage 0 is never a neighbour, its shapes differ).
A stage whose rule cannot apply (e.g. one neighbour only) uses a documented fallback, recorded in the metrics.
"""

from __future__ import annotations

import logging
import time

import torch

from checkfree.recovery import planner
from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.execute import execute_local
from checkfree.recovery.math import is_consecutive
from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import RecoveryRecord
from checkfree.training_state import StateDict, TrainingState

log = logging.getLogger(__name__)


class NoFailure(RecoveryStrategy):
    """``no_failure``: failures are drawn and logged, nothing is lost (the reference curve)."""

    name = "no_failure"

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        return []


class _NeighbourStrategy(RecoveryStrategy):
    """Shared loop: the planner decides each lost stage's rule and sources; the rule table executes the plans on
    local stages (:func:`checkfree.recovery.execute.execute_local`), each rebuilt stage with a fresh Adam at
    lr × lr_scale."""

    planner_setting = ""
    """The planner's setting this strategy executes (its canonical name; a subclass keeps its parent's)."""

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        plans = planner.plan(failed, state.n_stages, self.planner_setting)
        records = []
        for stage in sorted(failed):
            t0 = time.perf_counter()
            record = self.execute(state, stage, plans[stage])
            record.consecutive = is_consecutive(stage, failed)
            record.latency_s = time.perf_counter() - t0
            if record.consecutive:
                log.info(
                    "stage %d failed together with a neighbour; rebuilt from live stages %s",
                    stage,
                    record.source_stages,
                )
            records.append(record)
        return records

    def execute(self, state: TrainingState, stage: int, plan: RecoveryPlan) -> RecoveryRecord:
        """Rebuild ``stage`` by ``plan`` from the live stages of ``state`` (loaded, with a fresh Adam at
        lr × lr_scale) and return its record.

        Raises:
            ValueError: a rule this strategy cannot execute (e.g. "stage0_copy" without the copies).
        """
        return execute_local(state, stage, plan, self.cfg, self.seed, self.name, self.copies_of_stage0())

    def copies_of_stage0(self) -> StateDict | None:
        """The copies of E and E⁻¹ the "stage0_copy" rule reads (CheckFree+); None: this strategy keeps none."""
        return None


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

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.stage0_copy: StateDict | None = None
        """The copies of E and E⁻¹ (stage 0's state dict) stages 1 and S hold, kept from :meth:`setup` on."""

    def copies_of_stage0(self) -> StateDict | None:
        return self.stage0_copy

    def setup(self, state: TrainingState) -> None:
        self.stage0_copy = state.stage_state(0)

    def after_step(self, state: TrainingState) -> None:
        with torch.no_grad():
            for k, v in state.stages[0].state_dict().items():
                self.stage0_copy[k].copy_(v)

    def stats(self) -> dict:
        copy = self.stage0_copy or {}
        return {"extra_memory_bytes": sum(t.numel() * t.element_size() for t in copy.values())}
