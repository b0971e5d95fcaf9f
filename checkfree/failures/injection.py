"""Where the simulator's stage failures come from: a seeded random injector, or a fixed schedule.

A *stage failure* is the loss of every replica of one stage at once (paper §3); the trainer asks a
:class:`StageFailureSource` which stages fail at the start of each iteration.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import numpy as np

from checkfree.failures.rates import check_probability

# Stream tags of the injector: transformer stages and stage 0 draw from separate streams (never 0, so a
# tag cannot collide with SeedSequence's zero padding).
_TRANSFORMER_STREAM = 1
_STAGE0_STREAM = 2


@runtime_checkable
class StageFailureSource(Protocol):
    """Anything that says which stages fail at an iteration (injector or schedule); the trainer takes either."""

    def draw(self, iteration: int) -> list[int]:
        """Sorted ids of the stages that fail at the start of ``iteration``."""
        ...


class StageFailureInjector:
    """Seeded random stage failures, identical on every DP rank and for every recovery strategy (docs/paper.md §1).

    Each transformer stage 1..n_stages (and stage 0 when ``include_stage0``) fails independently with
    ``probability`` per iteration. The draw is a pure function of (seed, iteration): no state is kept and no
    global RNG is touched, so a resumed or rolled-back run sees the same failures at the same iteration.
    Stage 0 draws from a separate stream, so ``include_stage0`` never changes the other stages' draws, and
    stage s's draw does not depend on n_stages.
    """

    def __init__(self, n_stages: int, probability: float, seed: int, include_stage0: bool = False) -> None:
        if not isinstance(n_stages, int) or n_stages < 1:
            raise ValueError(f"n_stages {n_stages!r} is invalid: expected a positive integer.")
        check_probability(probability, "failure probability")
        if not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"seed {seed!r} is invalid: expected an integer in [0, 2^63).")
        self.n_stages = n_stages
        self.probability = float(probability)
        self.seed = seed
        self.include_stage0 = include_stage0

    def _uniforms(self, iteration: int, stream: int, count: int) -> np.ndarray:
        seq = np.random.SeedSequence([self.seed, iteration, stream])
        return np.random.Generator(np.random.PCG64(seq)).random(count)

    def draw(self, iteration: int) -> list[int]:
        """Sorted failed stage ids at ``iteration`` (≥ 0); raises ValueError for a negative iteration."""
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(f"iteration {iteration!r} is invalid: expected a non-negative integer.")
        u = self._uniforms(iteration, _TRANSFORMER_STREAM, self.n_stages)  # (n_stages,), stage s at u[s-1]
        failed = [s + 1 for s in np.flatnonzero(u < self.probability).tolist()]
        if self.include_stage0 and self._uniforms(iteration, _STAGE0_STREAM, 1)[0] < self.probability:
            failed.insert(0, 0)
        return failed


class StageSchedule:
    """A fixed list of (iteration, stage) failures, e.g. from ``--failure-schedule FILE``.

    Attributes:
        short_iterations: for a schedule replayed from slot down intervals (a real preemption trace), stage →
            the iterations it ran on fewer than all of its replicas (empty otherwise); the trainer records them.
        lost_iterations: the same for the iterations in which every replica of the stage was down.
    """

    def __init__(
        self,
        failures: Iterable[tuple[int, int]],
        n_stages: int,
        short_iterations: dict[int, list[int]] | None = None,
        lost_iterations: dict[int, list[int]] | None = None,
    ) -> None:
        self.n_stages = n_stages
        self.short_iterations = short_iterations or {}
        self.lost_iterations = lost_iterations or {}
        self._by_iteration: dict[int, list[int]] = {}
        for iteration, stage in sorted(set(failures)):
            self._by_iteration.setdefault(iteration, []).append(stage)

    def failures_at(self, iteration: int) -> list[int]:
        """Sorted stage ids that fail at the start of ``iteration``."""
        return list(self._by_iteration.get(iteration, []))

    def draw(self, iteration: int) -> list[int]:
        """Same as :meth:`failures_at` (the :class:`StageFailureSource` interface)."""
        return self.failures_at(iteration)

    def all(self) -> list[tuple[int, int]]:
        """Every (iteration, stage) pair, sorted by iteration then stage."""
        return [(it, s) for it, stages in sorted(self._by_iteration.items()) for s in stages]

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_iteration.values())
