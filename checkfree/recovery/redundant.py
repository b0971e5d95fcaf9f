"""``redundant``: redundant computation (Bamboo, Thorpe et al., NSDI'23; paper §5, docs/paper.md §5).

Every stage j holds an exact replica of its successor — weights, Adam state and LR multiplier — refreshed after
every optimizer step. Stages form a ring over 0..S: stage j−1 holds stage j's replica for j ≥ 1 and stage S holds
stage 0's, so stage 0 is recoverable too. A lost stage is restored bit-for-bit from its predecessor's replica,
and training goes on as if nothing had failed (convergence per iteration = no failure).

Costs recorded for the timing model (checkfree.report.timing): the memory of the replicas, and Bamboo's redundant forward
of the next stage, timed every ``redundant_measure_every`` iterations as one no-grad forward of each replica on a
(batch_size, seq_l) microbatch (the work a stage adds per microbatch; the bottleneck is the largest of them).
Convergence is simulated without Bamboo's halved microbatch size (the paper's memory workaround).

Fallback (documented, logged as such): a stage whose predecessor failed in the same iteration cannot be restored
from that replica, since it died with the predecessor. First every stage with a live predecessor is restored
exactly; then each remaining transformer stage is rebuilt by the CheckFree rule (§4.1) from its nearest stages
that are alive or already restored — a gradient-norm-weighted average of both sides, a copy when only one side
exists — with a fresh Adam at lr × lr_scale; a remaining stage 0 (stage S lost too) gets a random init.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import torch

from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.execute import execute_local
from checkfree.recovery.math import is_consecutive
from checkfree.recovery.planner import RecoveryPlan, live_neighbours
from checkfree.recovery.record import RecoveryRecord
from checkfree.recovery.stage_copy import StageCopy, refresh_copy, restore_copy, take_copy
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)


def predecessor(stage: int, n_stages: int) -> int:
    """The stage holding ``stage``'s replica: stage − 1, and stage S for stage 0 (a ring over 0..S)."""
    return stage - 1 if stage >= 1 else n_stages


class Redundant(RecoveryStrategy):
    """``redundant`` (Bamboo): exact restore from the predecessor's replica; see the module docstring."""

    name = "redundant"

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.replicas: dict[int, StageCopy] = {}  # replicated stage → its copy (held by its predecessor)
        self.modules: dict[int, torch.nn.Module] = {}  # the replicas as modules, for the redundant forward
        self.forward_seconds: dict[int, list[float]] = {}
        self.refresh_seconds = 0.0
        self.fallbacks = 0
        self._device = torch.device("cpu")

    def setup(self, state: TrainingState) -> None:
        self._device = next(state.stages[0].parameters()).device
        for j in range(len(state.stages)):
            self.modules[j] = copy.deepcopy(state.stages[j]).requires_grad_(False)
            replica = take_copy(state, j)
            replica.weights = self.modules[j].state_dict()  # the module's own tensors: one copy, not two
            self.replicas[j] = replica
        self.forward_seconds = {j: [] for j in self.modules}

    def after_step(self, state: TrainingState) -> None:
        t0 = time.perf_counter()
        for j, replica in self.replicas.items():
            refresh_copy(replica, state, j)
        self.refresh_seconds += time.perf_counter() - t0
        every = self.cfg.redundant_measure_every
        if every and state.iteration % every == 0:
            self.measure_forward()

    @torch.no_grad()
    def measure_forward(self) -> dict[int, float]:
        """Seconds of one no-grad forward of each replica on one microbatch (Bamboo's extra work per microbatch).

        Returns {replicated stage: seconds}; the values are also averaged into :meth:`stats`.
        """
        cfg, dev = self.cfg, self._device
        gen = torch.Generator().manual_seed(0)
        h = torch.randn(cfg.batch_size, cfg.seq_l, cfg.dmodel, generator=gen).to(dev)  # (B, T, d)
        ids = torch.randint(
            0, self.modules[0].lm_head.out_features, (cfg.batch_size, cfg.seq_l), generator=gen
        ).to(dev)  # (B, T)
        autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if dev.type == "cuda"
            else torch.autocast("cpu", enabled=False)
        )
        out = {}
        with autocast:
            for j, module in self.modules.items():
                _sync(dev)
                t0 = time.perf_counter()
                if j == 0:
                    module.head(module.embed(ids))
                else:
                    module(h)
                _sync(dev)
                out[j] = time.perf_counter() - t0
                self.forward_seconds[j].append(out[j])
        return out

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        lost = set(failed)
        records: dict[int, RecoveryRecord] = {}
        orphans = []
        for j in sorted(lost):
            holder = predecessor(j, state.n_stages)
            if holder in lost:
                orphans.append(j)
                continue
            t0 = time.perf_counter()
            restore_copy(self.replicas[j], state, j)
            records[j] = RecoveryRecord(
                j,
                "replica",
                self.name,
                source_stages=[holder],
                weights=[1.0],
                consecutive=is_consecutive(j, lost),
                latency_s=time.perf_counter() - t0,
            )
        still_lost = set(orphans)
        for j in orphans:
            t0 = time.perf_counter()
            records[j] = self._fallback(state, j, still_lost)
            records[j].latency_s = time.perf_counter() - t0
            still_lost.discard(j)
            self.fallbacks += 1
            log.info(
                "stage %d: its replica died with stage %d; fallback %s",
                j,
                predecessor(j, state.n_stages),
                records[j].fallback,
            )
        return [records[j] for j in sorted(records)]

    def _fallback(self, state: TrainingState, j: int, still_lost: set[int]) -> RecoveryRecord:
        holder = predecessor(j, state.n_stages)
        why = f"predecessor {holder} (replica holder) lost too"
        if j == 0:
            plan = RecoveryPlan("random", fallback=f"{why}: random init of stage 0")
        else:
            left, right = live_neighbours(j, still_lost, state.n_stages)
            sources = tuple(s for s in (left, right) if s is not None)
            if not sources:
                raise RuntimeError(f"stage {j} has no live transformer stage to fall back on.")
            rule = "copy" if len(sources) == 1 else "checkfree"
            plan = RecoveryPlan(rule, sources, fallback=f"{why}: {rule} rule from stages {list(sources)}")
        record = execute_local(state, j, plan, self.cfg, self.seed, self.name)
        record.consecutive = True
        return record

    def stats(self) -> dict[str, Any]:
        means = {j: sum(v) / len(v) for j, v in self.forward_seconds.items() if v}
        transformer = [means[j] for j in means if j >= 1]
        return {
            "extra_memory_bytes": sum(r.nbytes for r in self.replicas.values()),
            "redundant_forward_seconds_per_microbatch": max(transformer) if transformer else None,
            "redundant_forward_seconds_by_stage": {str(j): round(v, 6) for j, v in sorted(means.items())},
            "redundant_forward_measurements": min((len(v) for v in self.forward_seconds.values()), default=0),
            "replica_refresh_seconds": round(self.refresh_seconds, 6),
            "fallbacks": self.fallbacks,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
