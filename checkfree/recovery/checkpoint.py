"""Checkpoint baselines (docs/paper.md §4–§5): ``checkpoint`` (the paper's; alias ``whole_model``) and ``one``.

Both take a universal checkpoint (:mod:`checkfree.checkpoint.store`) every K effective iterations, at the start of
the iteration (before that iteration's failures), with K = ``checkpoint_every`` or, when 0, the paper's value by
model size: 50 below 200 M parameters (small), 100 below 1 B (medium), 40 above (large). The first checkpoint is
taken at the first iteration (iteration 0 of a fresh run), so a failure before any other rolls back to it.
Saves go through :class:`~checkfree.checkpoint.writer.SnapshotWriter` in the ``save_mode`` "sync", "async"
(DataStates-LLM) or "memory" (Gemini); disk checkpoints live in ``<run>/checkpoints/strategy/`` and can be
resumed from with ``--resume-from``.

When they checkpoint is the config key ``checkpoint_rule`` (:data:`CHECKPOINT_RULES`):

* ``"effective"`` (the default): at the start of every *effective* iteration that is a multiple of K, before that
  iteration's failures. A failure rolls back to the newest one and the failed iteration trains from there: it loses
  0 … K − 1 iterations.
* ``"authors"``: the rule of the authors' ``checkpoint_simulation.py`` (gensyn-ai/CheckFree, commit 0e2711d,
  lines 82–100; docs/paper.md §7): checkpoints at *wall-clock* multiples of K, each holding the training position
  of that moment; a failure loses its position inside the wall-clock interval (rolls back to the interval's
  checkpoint), a failure on the boundary itself the whole interval (back to the previous checkpoint, never below
  it). ``checkpoint_paper_interval`` K_p gives the granularity: K of our iterations stand for K_p of the paper's,
  so each of ours stands for g = K_p / K paper iterations, and each failure is placed (seeded by the run's seed,
  a pure function of seed, iteration and stage: :func:`failure_offset`) at one paper iteration inside its span.
  It is on the boundary when that paper iteration is a multiple of K_p (the span's first, at a wall-clock multiple
  of K); its position inside our iteration rounds to the nearest of ours, so a failure in the span's second half
  loses the failed iteration too (:func:`authors_placement`). With K_p = K (the default, 0) each iteration is one
  of the paper's, and every failure at a multiple of K loses a whole interval.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

from checkfree.checkpoint import store
from checkfree.checkpoint.writer import SnapshotWriter
from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.record import RecoveryRecord
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)

# Paper §5 / docs/paper.md §5: checkpoint interval by model size (parameters below the bound → K).
PAPER_CHECKPOINT_EVERY = ((200_000_000, 50), (1_000_000_000, 100), (float("inf"), 40))


CHECKPOINT_RULES = ("effective", "authors")
"""``checkpoint_rule`` values (module docstring)."""
PLACEMENT_TAG = 0xC4EC
"""Mixed into the seed of :func:`failure_offset` so that its draws are independent of the failure injector's."""


def check_rule(rule: str, every: int, paper_interval: int) -> None:
    """Refuse an unknown ``checkpoint_rule`` or a ``checkpoint_paper_interval`` below K.

    Raises:
        ValueError: one sentence naming the value and what is expected.
    """
    if rule not in CHECKPOINT_RULES:
        raise ValueError(f"'checkpoint_rule' is {rule!r}; expected one of {list(CHECKPOINT_RULES)}.")
    if paper_interval and paper_interval < every:
        raise ValueError(
            f"'checkpoint_paper_interval' is {paper_interval}; expected 0 or at least checkpoint_every {every} "
            "(each of our iterations stands for one or more of the paper's)."
        )


def paper_span(iteration: int, every: int, paper_every: int) -> tuple[int, int]:
    """(first paper iteration, number of paper iterations) that wall-clock ``iteration`` stands for when ``every``
    of ours stand for ``paper_every`` of the paper's: [⌈w·g⌉, ⌈(w+1)·g⌉) with g = paper_every / every, in exact
    integer arithmetic (a checkpoint's paper iteration m·paper_every is the first of wall-clock iteration m·every)."""
    first = -(-iteration * paper_every // every)
    return first, -(-(iteration + 1) * paper_every // every) - first


def failure_offset(seed: int, iteration: int, stage: int, n: int) -> int:
    """The paper iteration, 0 … n − 1 inside the span of wall-clock ``iteration``, at which ``stage`` fails:
    uniform, a pure function of (seed, iteration, stage) (the simulator and the report's replay draw the same)."""
    if n <= 1:
        return 0
    return int(np.random.default_rng((PLACEMENT_TAG, seed, iteration, stage)).integers(n))


@dataclass(frozen=True)
class Placement:
    """Where the failures of one wall-clock iteration fall under the ``authors`` rule."""

    boundary: bool
    """A failure lands on a checkpoint's paper iteration: that checkpoint is lost (back to the previous one)."""
    iteration_lost: bool
    """The latest failure lies in the second half of the span: the failed iteration's work is lost too."""


def authors_placement(
    seed: int, iteration: int, failed: list[int], every: int, paper_every: int
) -> Placement:
    """The ``authors`` rule's reading of wall-clock ``iteration``'s failures ``failed`` (module docstring).

    ``every``: K (ours); ``paper_every``: K_p, the paper iterations K of ours stand for (≥ every).
    """
    if not failed:
        return Placement(False, False)
    first, n = paper_span(iteration, every, paper_every)
    offsets = [failure_offset(seed, iteration, s, n) for s in failed]
    return Placement((first + min(offsets)) % paper_every == 0, 2 * max(offsets) >= n)


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
        self.rule = getattr(cfg, "checkpoint_rule", "effective")
        """``checkpoint_rule``: "effective" or "authors" (module docstring)."""
        check_rule(self.rule, cfg.checkpoint_every, getattr(cfg, "checkpoint_paper_interval", 0))
        self.paper_every = 0
        """K_p of the ``authors`` rule (set by :meth:`setup`): the paper iterations K of ours stand for."""
        self.iterations_lost = 0
        self.rollbacks = 0
        self._last_started: int | None = (
            None  # effective (wall-clock for "authors") iteration of the newest save
        )
        self._placement = Placement(False, False)  # the "authors" rule's reading of this iteration's failures

    def setup(self, state: TrainingState) -> None:
        ctx = self.ctx
        if ctx is None:
            raise RuntimeError(f"strategy {self.name!r} needs bind(ctx) before setup (the Trainer does it).")
        self.every = resolve_interval(self.cfg.checkpoint_every, state)
        self.paper_every = int(getattr(self.cfg, "checkpoint_paper_interval", 0) or 0) or self.every
        check_rule(self.rule, self.every, self.paper_every)
        root = None if ctx.checkpoint_dir is None else ctx.checkpoint_dir / self.checkpoint_subdir
        self.writer = SnapshotWriter(
            self.cfg.save_mode, root, self.cfg.keep_checkpoints, ctx.emit, writes=ctx.rank == 0
        )
        log.info(
            "%s: a checkpoint every %d iterations (rule %s, %d paper iterations), save mode %s",
            self.name,
            self.every,
            self.rule,
            self.paper_every,
            self.cfg.save_mode,
        )

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        self.writer.poll()
        if self.rule == "authors":
            w = state.iteration
            self._placement = authors_placement(self.seed, w, failed, self.every, self.paper_every)
            if self._last_started is not None and (w % self.every or self._placement.boundary):
                return  # a failure on the boundary takes this checkpoint with it: back to the previous one
            self._last_started = w
        else:
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
            "checkpoint_rule": self.rule,
            "checkpoint_paper_interval": self.paper_every,
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
        iteration_lost = self.rule == "authors" and self._placement.iteration_lost
        lost = from_eff - state.effective_iteration + iteration_lost
        self.iterations_lost += lost
        self.rollbacks += 1
        self.emit(
            "rollback",
            iteration=wall,
            from_effective_iteration=from_eff,
            to_effective_iteration=state.effective_iteration,
            iterations_lost=lost,
            **({"failed_iteration_lost": iteration_lost} if self.rule == "authors" else {}),
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

    def after_step(self, state: TrainingState) -> None:
        """``authors`` rule, a failure in the second half of its span: the iteration just trained is lost too.

        The checkpoint is restored again and the position set one before it, so the trainer's increment lands on
        the checkpoint's: the wall-clock iteration passed, the training position did not move."""
        if self.rule != "authors" or not self._placement.iteration_lost:
            return
        self._placement = Placement(self._placement.boundary, False)
        wall = state.iteration
        store.restore(self._latest(), state, self.cfg.n_layers_per_stage)
        state.iteration = wall
        state.effective_iteration -= 1


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
