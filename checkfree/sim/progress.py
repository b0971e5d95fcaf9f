"""Wall-clock progress of a run whose training position can roll back (the ``checkpoint`` baseline).

Under ``checkpoint`` every failure rolls every stage back to the last checkpoint, so a run needs more wall-clock
iterations than ``max_iterations``. With q the probability that at least one stage fails in an iteration and K
iterations between checkpoints, one segment of K iterations is finished after (1 − q)^−K − 1) / q wall-clock
iterations on average (the expected number of Bernoulli trials until K successes in a row), so a whole run takes

    E[wall-clock iterations] = max_iterations / K · ((1 − q)^−K − 1) / q

which explodes when q·K ≳ 1 (e.g. 4 stages at p = 0.05 and K = 50: ≈ 150,000 iterations per segment).
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


def expected_wall_iterations(q: float, every: int, max_iterations: int) -> float:
    """Expected wall-clock iterations to train ``max_iterations`` with a rollback to a checkpoint taken every
    ``every`` iterations, when an iteration fails with probability ``q`` (module docstring); inf when q ≥ 1."""
    if max_iterations <= 0:
        return 0.0
    if q <= 0.0:
        return float(max_iterations)
    if q >= 1.0:
        return math.inf
    segment = min(every, max_iterations) if every > 0 else max_iterations
    try:
        per_segment = math.expm1(-segment * math.log1p(-q)) / q
    except OverflowError:
        return math.inf
    return max_iterations / segment * per_segment


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
    return expected_wall_iterations(any_failure_probability(p, stages), strategy.every, max_iterations)
