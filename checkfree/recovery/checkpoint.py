"""Checkpoint baselines (docs/paper.md §4–§5): ``checkpoint`` (the paper's; alias ``whole_model``) and ``one``.

Both take a universal checkpoint (:mod:`checkfree.checkpoint.store`) every K effective iterations, at the start of
the iteration (before that iteration's failures), with K = ``checkpoint_every`` or, when 0, the paper's value by
model size: 50 below 200 M parameters (small), 100 below 1 B (medium), 40 above (large). The first checkpoint is
taken at the first iteration (iteration 0 of a fresh run), so a failure before any other rolls back to it.
Saves go through :class:`~checkfree.checkpoint.writer.SnapshotWriter` in the ``save_mode`` "sync", "async"
(DataStates-LLM) or "memory" (Gemini); disk checkpoints live in ``<run>/checkpoints/strategy/`` and can be
resumed from with ``--resume-from``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist

from checkfree.checkpoint import store
from checkfree.checkpoint.writer import SnapshotWriter
from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.record import RecoveryRecord
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)

# Paper §5 / docs/paper.md §5: checkpoint interval by model size (parameters below the bound → K).
PAPER_CHECKPOINT_EVERY = ((200_000_000, 50), (1_000_000_000, 100), (float("inf"), 40))


def paper_interval(n_parameters: int) -> int:
    """The paper's checkpoint interval K for a model of ``n_parameters`` (small 50, medium 100, large 40)."""
    return next(k for bound, k in PAPER_CHECKPOINT_EVERY if n_parameters < bound)


def resolve_interval(configured: int, state: TrainingState) -> int:
    """``configured`` when > 0, else :func:`paper_interval` of the state's parameter count."""
    if configured > 0:
        return configured
    return paper_interval(sum(p.numel() for s in state.stages for p in s.parameters()))


class CheckpointBaseline(RecoveryStrategy):
    """Shared part of ``checkpoint`` and ``one``: a checkpoint every K effective iterations through a
    :class:`SnapshotWriter`."""

    checkpoint_subdir = "strategy"

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.every = 0
        """K: effective iterations between checkpoints, set by :meth:`setup` (checkfree.sim.progress reads it to
        expect the length of a run that rolls back)."""
        self.writer: SnapshotWriter | None = None
        self.iterations_lost = 0
        self.rollbacks = 0
        self._last_started: int | None = None  # effective iteration of the newest save started

    def setup(self, state: TrainingState) -> None:
        ctx = self.ctx
        if ctx is None:
            raise RuntimeError(f"strategy {self.name!r} needs bind(ctx) before setup (the Trainer does it).")
        self.every = resolve_interval(self.cfg.checkpoint_every, state)
        root = None if ctx.checkpoint_dir is None else ctx.checkpoint_dir / self.checkpoint_subdir
        self.writer = SnapshotWriter(
            self.cfg.save_mode, root, self.cfg.keep_checkpoints, ctx.emit, writes=ctx.rank == 0
        )
        log.info(
            "%s: a checkpoint every %d iterations, save mode %s", self.name, self.every, self.cfg.save_mode
        )

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        self.writer.poll()
        e = state.effective_iteration
        if self._last_started is not None and (e % self.every or e == self._last_started):
            return
        self._last_started = e
        snap = store.capture(
            state,
            self.cfg.n_layers_per_stage,
            self.cfg.to_json(),
            strategy=self.name,
            copy=False,
            world_size=self.ctx.world_size,
        )
        self.writer.start(snap, defer=not failed)

    def before_optimizer_step(self, state: TrainingState) -> None:
        self.writer.end_capture()

    def finish(self, state: TrainingState) -> None:
        self.writer.close()

    def _latest(self) -> store.Snapshot:
        """The newest checkpoint, once every rank can read it."""
        snap = self.writer.load_latest() if self.ctx.rank == 0 or self.writer.mode == "memory" else None
        if self.ctx.world_size > 1 and self.writer.mode != "memory":
            dist.barrier(group=self.ctx.group)  # rank 0 has finished writing it
            snap = snap or self.writer.load_latest()
        return snap

    def stats(self) -> dict[str, Any]:
        out = self.writer.stats() if self.writer is not None else {}
        return {
            **out,
            "checkpoint_every": self.every,
            "iterations_lost": self.iterations_lost,
            "rollbacks": self.rollbacks,
        }


class Checkpoint(CheckpointBaseline):
    """``checkpoint`` (alias ``whole_model``): on any stage failure, roll everything back to the last checkpoint.

    Every stage, optimizer, LR multiplier, gradient norm, the RNG and the data position (``effective_iteration``)
    return to the checkpoint; the wall-clock ``iteration`` keeps growing, so failures keep being drawn by it and
    the iterations since the checkpoint are lost and redone. One "rollback" line (emitted before the trainer writes
    the recovery records) records them. Stage 0 is recovered like any other. Several
    stages failing at once cost one rollback (no fallback is ever needed).
    """

    name = "checkpoint"

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        t0 = time.perf_counter()
        snap = self._latest()
        wall, from_eff = state.iteration, state.effective_iteration
        store.restore(snap, state, self.cfg.n_layers_per_stage)
        state.iteration = wall  # the wall clock never goes back; only the training position does
        lost = from_eff - state.effective_iteration
        self.iterations_lost += lost
        self.rollbacks += 1
        self.emit(
            "rollback",
            iteration=wall,
            from_effective_iteration=from_eff,
            to_effective_iteration=state.effective_iteration,
            iterations_lost=lost,
        )
        log.info(
            "iteration %d: rolled back from effective iteration %d to %d (%d iterations lost)",
            wall,
            from_eff,
            state.effective_iteration,
            lost,
        )
        seconds = time.perf_counter() - t0
        return [
            RecoveryRecord(
                s,
                "rollback",
                self.name,
                latency_s=seconds,
                extra={"to_effective_iteration": state.effective_iteration, "iterations_lost": lost},
            )
            for s in sorted(failed)
        ]


class One(CheckpointBaseline):
    """``one``: restore only the failed stage(s) (weights, Adam state, LR multiplier) from the last checkpoint.

    The other stages keep their current state and training does not go back: nothing is lost or redone, but the
    restored stage is stale by up to K iterations (recorded as ``stale_iterations``). Stage 0 is recovered the
    same way; several failed stages are each restored from the same checkpoint (no fallback is ever needed).
    """

    name = "one"

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        t0 = time.perf_counter()
        snap = self._latest()
        stale = state.effective_iteration - snap.effective_iteration
        for s in sorted(failed):
            store.restore_stage(snap, state, s, self.cfg.n_layers_per_stage)
        seconds = time.perf_counter() - t0
        return [
            RecoveryRecord(
                s,
                "restore_one",
                self.name,
                latency_s=seconds,
                extra={"checkpoint_effective_iteration": snap.effective_iteration, "stale_iterations": stale},
            )
            for s in sorted(failed)
        ]
