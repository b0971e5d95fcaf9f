"""``ladder``: the exactness ladder. For each lost stage, the most exact source that exists, in order:

1. ``replica``: a live replica of the stage (swarm only: in the simulator a failure loses every replica);
2. ``redundant``: the exact copy its predecessor holds (Bamboo's ring, :mod:`checkfree.recovery.redundant`),
   if the predecessor survived; then ``ec_snapshot``: the stage's REFT snapshot decoded from the parity block
   (:mod:`checkfree.recovery.ec_snapshot`), if it is the only transformer stage lost in this event and the
   snapshot is at most ``ladder_max_stale`` iterations old (0 = any age; snapshots are taken every
   ``snapshot_every`` iterations);
3. ``neighbour``: the CheckFree+ rule (paper §4.2: partner copy at the ends, the gradient-norm-weighted average of
   §4.1 Eq. 2 in the middle, stage 0 from the embedding/head copies on stages 1 and S) from the stages that are
   alive or were restored exactly in step 2, with a fresh Adam at lr × lr_scale;
4. ``random``: a fresh N(0, init_std) initialisation with a fresh Adam at lr × lr_scale.

Which rungs exist is the config key ``ladder_rungs`` (comma-separated; default ``ec_snapshot,neighbour,random``):
``redundant`` is off by default because it doubles every stage's memory and adds a forward per microbatch;
``ec_snapshot`` keeps one snapshot per stage in host memory plus one parity block. Memory and traffic are the sum
of the rungs kept (``strategy_stats``). Every recovery record names its ``rung``. None of the systems compared in
the paper chooses, per failure, between an exact and an approximate recovery; this strategy does.

The ladder runs CheckFree+ out-of-order execution (its neighbour rung is CheckFree+), so it needs swaps (run.sh).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import Any

from checkfree.config import parse_ladder_rungs
from checkfree.recovery import planner, rules
from checkfree.recovery.base import RecoveryStrategy, StrategyContext
from checkfree.recovery.ec_snapshot import ECSnapshot
from checkfree.recovery.math import is_consecutive
from checkfree.recovery.neighbours import CheckFreePlus
from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import RecoveryRecord
from checkfree.recovery.redundant import Redundant
from checkfree.recovery.stage_copy import restore_copy
from checkfree.training_state import TrainingState


class Ladder(RecoveryStrategy):
    """``ladder``: per lost stage, the most exact rung available; see the module docstring."""

    name = "ladder"

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.rungs = parse_ladder_rungs(cfg.ladder_rungs)
        self.redundant = Redundant(cfg, seed) if "redundant" in self.rungs else None
        self.ec = ECSnapshot(cfg, seed) if "ec_snapshot" in self.rungs else None
        self.neighbour = CheckFreePlus(cfg, seed) if "neighbour" in self.rungs else None
        self.executor = self.neighbour or CheckFreePlus(cfg, seed)  # runs the neighbour/random plans
        self.used: Counter[str] = Counter()

    @property
    def _parts(self) -> list[RecoveryStrategy]:
        return [s for s in (self.redundant, self.ec, self.neighbour) if s is not None]

    # ------------------------------------------------------------------ hooks: every rung kept keeps its state
    def bind(self, ctx: StrategyContext) -> None:
        super().bind(ctx)
        for part in self._parts:  # one context: the rungs' lines are written in the order they are produced
            part.bind(ctx)

    def setup(self, state: TrainingState) -> None:
        for part in self._parts:
            part.setup(state)

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        for part in self._parts:
            part.begin_iteration(state, failed)

    def before_optimizer_step(self, state: TrainingState) -> None:
        for part in self._parts:
            part.before_optimizer_step(state)

    def after_step(self, state: TrainingState) -> None:
        for part in self._parts:
            part.after_step(state)

    def finish(self, state: TrainingState) -> None:
        for part in self._parts:
            part.finish(state)

    # ------------------------------------------------------------------ recovery
    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        lost = set(failed)
        ec = self.ec
        stale = None if ec is None or ec.parity is None else state.effective_iteration - ec.snapshot_effective
        fresh = stale is not None and (not self.cfg.ladder_max_stale or stale <= self.cfg.ladder_max_stale)
        plans = planner.plan_ladder(failed, state.n_stages, self.rungs, ec_fresh=fresh)
        records = []
        for j in sorted(failed):
            t0, p = time.perf_counter(), plans[j]
            if p.rung == "redundant":
                record = self._restore_redundant(state, j, p)
            elif p.rung == "ec_snapshot":
                record = ec.decode(state, j)
            else:  # neighbour or random: the planner's rule, a fresh Adam at lr × lr_scale
                record = self.executor.execute(state, j, p)
            self._finish(record, p.rung, t0, lost)
            records.append(record)
        if ec is not None and any(plans[j].rung != "ec_snapshot" for j in lost if j >= 1):
            ec.snapshot_round(
                state
            )  # snapshots died with their stages: a new round makes the code complete again
        return records

    def _restore_redundant(self, state: TrainingState, j: int, plan: RecoveryPlan) -> RecoveryRecord:
        """Stage ``j`` from the Bamboo copy its predecessor holds: the weights through the rule table's
        ``replica`` (a copy of the copy), the Adam state and LR multiplier restored with them."""
        held = self.redundant.replicas[j]
        inputs = rules.RuleInputs(
            template=state.stages[j].state_dict(),
            sources=[held.weights],  # what the one source, the predecessor, holds of stage j
            stage=j,
            iteration=state.iteration,
            seed=self.seed,
            cfg=self.cfg,
        )
        restore_copy(dataclasses.replace(held, weights=rules.rebuild(plan, inputs).state), state, j)
        return RecoveryRecord(j, plan.rule, self.name, source_stages=list(plan.sources), weights=[1.0])

    def _finish(self, record: RecoveryRecord, rung: str, t0: float, lost: set[int]) -> None:
        record.strategy = self.name
        record.rung = rung
        record.consecutive = is_consecutive(record.stage, lost)
        record.latency_s = time.perf_counter() - t0
        self.used[rung] += 1

    def stats(self) -> dict[str, Any]:
        parts = [part.stats() for part in self._parts]
        out: dict[str, Any] = {
            "rungs": list(self.rungs),
            "rungs_used": dict(self.used),
            "extra_memory_bytes": sum(p.get("extra_memory_bytes", 0) for p in parts),
        }
        for p in parts:  # the kept rungs' own costs (parity traffic, redundant forward, …)
            for k, v in p.items():
                out.setdefault(k, v)
        return out
