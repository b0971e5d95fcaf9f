"""Wall-clock progress of a run whose training position can roll back (the ``checkpoint`` baseline).

Under ``checkpoint`` every failure rolls every stage back to the last checkpoint, so a run needs more wall-clock
iterations than ``max_iterations``. With q the probability that at least one stage fails in an iteration and K
iterations between checkpoints, the expected cost depends on the checkpoint rule (checkfree.recovery.checkpoint):

* ``effective`` (a checkpoint every K effective iterations, before that iteration's failures; the failed
  iteration trains from the checkpoint, so a failure at the segment's first iteration costs nothing): from a
  checkpoint, a segment of L iterations takes 1 + ((1 − q)^−(L − 1) − 1) / q wall-clock iterations on average
  (from position 1, each failure sends the run back to position 1: the trials until L − 1 successes in a row,
  plus the first iteration), so

      E[wall-clock iterations] = ⌊N / K⌋ · (1 + ((1 − q)^−(K − 1) − 1) / q) + (the same for the N mod K left);

* ``authors`` (checkpoints at wall-clock multiples of the paper's K_p iterations, a failure losing its position
  in the interval and a failure on the boundary the whole interval; with q_p = 1 − (1 − q)^(K / K_p) per paper
  iteration): an interval keeps K_p − L iterations, L the offset of its last failure (0 without one), unless the
  next interval starts with a failure (probability q_p) that takes its checkpoint; E[L] = Σ_{m=1}^{K_p − 1}
  (1 − (1 − q_p)^m), so

      E[wall-clock iterations] = N · K_p / ((1 − q_p) · (K_p − E[L])).

Both explode when q·K ≳ 1 (e.g. 4 stages at p = 0.05 and K = 50: ≈ 100,000 iterations per segment).
tests/report/test_checkpoint_cost.py checks both against a Monte Carlo of the rules as the report replays them
(checkfree.report.replay, which matches real runs exactly).
:class:`WallClockGuard` warns about that at the start, shows the effective progress rate (training iterations
gained per wall-clock iteration) and stops the run at a wall-clock limit.
"""

from __future__ import annotations

import math

from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.checkpoint import CheckpointBaseline

WARN_FACTOR = 10
"""Warn when the expected wall-clock length exceeds this many times max_iterations."""
DEFAULT_LIMIT_FACTOR = 20
"""Default ``--max-wall-iterations``: this many times max_iterations."""


def any_failure_probability(probability: float, stages: int) -> float:
    """q = 1 − (1 − p)^stages: the probability that at least one of ``stages`` stages fails in an iteration."""
    return 1.0 - (1.0 - probability) ** stages


def _segment(q: float, length: int) -> float:
    """Expected wall-clock iterations to train ``length`` ≥ 1 iterations from a checkpoint, ``effective`` rule."""
    return 1.0 + math.expm1(-(length - 1) * math.log1p(-q)) / q


def _authors_factor(q: float, every: int, paper_every: int) -> float:
    """Wall-clock iterations per trained iteration under the ``authors`` rule (module docstring)."""
    keep = math.exp(every / paper_every * math.log1p(-q))  # 1 − q_p
    q_paper = -math.expm1(every / paper_every * math.log1p(-q))
    n = paper_every - 1
    mean_last = n - keep * -math.expm1(n * math.log(keep)) / q_paper  # Σ_{m=1}^{n} (1 − keep^m)
    kept = keep * (paper_every - mean_last)
    return math.inf if kept <= 0 else paper_every / kept


def expected_wall_iterations(
    q: float, every: int, max_iterations: int, rule: str = "effective", paper_every: int = 0
) -> float:
    """Expected wall-clock iterations to train ``max_iterations`` with a rollback to a checkpoint taken every
    ``every`` iterations under ``rule`` ("effective" or "authors", with K_p = ``paper_every``, 0 = ``every``),
    when an iteration fails with probability ``q`` (module docstring); inf when q ≥ 1 or it overflows.

    Raises:
        ValueError: an unknown ``rule``.
    """
    if rule not in ("effective", "authors"):
        raise ValueError(f"checkpoint rule {rule!r} is unknown; expected 'effective' or 'authors'.")
    if max_iterations <= 0:
        return 0.0
    if q <= 0.0:
        return float(max_iterations)
    if q >= 1.0:
        return math.inf
    segment = min(every, max_iterations) if every > 0 else max_iterations
    try:
        if rule == "authors":
            return max_iterations * _authors_factor(q, segment, max(paper_every, segment))
        full, rest = divmod(max_iterations, segment)
        return full * _segment(q, segment) + (_segment(q, rest) if rest else 0.0)
    except OverflowError:
        return math.inf


class WallClockGuard:
    """The wall-clock limit of a run and its progress rate.

    Args:
        max_iterations: training iterations the run must reach (effective iterations).
        limit: wall-clock iterations after which the run stops (None = DEFAULT_LIMIT_FACTOR × max_iterations).
    """

    def __init__(self, max_iterations: int, limit: int | None = None) -> None:
        self.max_iterations = max_iterations
        self.limit = limit if limit is not None else max(1, DEFAULT_LIMIT_FACTOR * max_iterations)

    def expected_length_warning(self, expected: float) -> str | None:
        """One sentence when ``expected`` wall-clock iterations exceed WARN_FACTOR × max_iterations, else None."""
        if expected <= WARN_FACTOR * self.max_iterations:
            return None
        shown = "forever" if math.isinf(expected) else f"≈ {expected:,.0f} wall-clock iterations"
        return (
            f"this run is expected to take {shown} for its {self.max_iterations} iterations (more than "
            f"{WARN_FACTOR}×): failures come faster than checkpoints; it stops at --max-wall-iterations "
            f"{self.limit}."
        )

    @staticmethod
    def rate(
        effective_iteration: int, iteration: int, start_effective: int = 0, start_iteration: int = 0
    ) -> float:
        """Training iterations gained per wall-clock iteration since the start (1.0 without rollbacks)."""
        done = iteration - start_iteration
        return (effective_iteration - start_effective) / done if done > 0 else 1.0

    def exceeded(self, iteration: int) -> bool:
        return iteration >= self.limit

    def stop_sentence(self, iteration: int, effective_iteration: int) -> str:
        return (
            f"stopped at wall-clock iteration {iteration} (--max-wall-iterations {self.limit}) with "
            f"{effective_iteration} of {self.max_iterations} iterations trained; everything written so far "
            "is kept: raise --max-wall-iterations, or lower the failure probability or checkpoint_every."
        )


def expected_run_length(strategy: RecoveryStrategy, failures, max_iterations: int) -> float | None:
    """Expected wall-clock iterations of a strategy that rolls back (``rollback_on_stage_loss``: a checkpoint
    baseline, with its interval ``every`` set by its setup) under a random injector (``probability``,
    ``n_stages``, ``include_stage0``); None when it does not apply."""
    p, n = getattr(failures, "probability", None), getattr(failures, "n_stages", None)
    if not strategy.rollback_on_stage_loss or p is None or n is None:
        return None
    if not isinstance(strategy, CheckpointBaseline):
        raise TypeError(f"strategy {strategy.name!r} rolls back but keeps no checkpoint interval.")
    stages = n + bool(getattr(failures, "include_stage0", False))
    q = any_failure_probability(p, stages)
    return expected_wall_iterations(q, strategy.every, max_iterations, strategy.rule, strategy.paper_every)
