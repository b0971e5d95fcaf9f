"""The exact baselines by replay: checkpointing and redundant computation computed from the no-failure run.

Checkpointing (rollback to the last checkpoint, paper §5) and redundant computation (Bamboo's exact restore from
the predecessor's replica) train the no-failure trajectory by construction: a rollback restores every stage,
optimizer, RNG state and the data position, and redoes the same batches; a Bamboo restore copies the lost stage
bit for bit. Their validation curve *indexed by effective iteration* is therefore the no-failure run's, and what a
failure costs them is only wall-clock iterations (rollbacks) or a slower iteration (redundancy). This module
replays that: given the no-failure run's validation losses, the failure draws and the strategy's rule, it returns
the evaluations a real run would have written, as (wall-clock iteration, validation loss) pairs, plus the
recoveries and rollbacks, which the report turns into simulated hours like any run
(:mod:`checkfree.report.timing`).

The rules replayed are the simulator's own (:mod:`checkfree.recovery.checkpoint`, :mod:`checkfree.recovery.redundant`,
:class:`checkfree.sim.trainer.Trainer`):

* failures are drawn by wall-clock iteration ``w`` at the start of the iteration;
* ``checkpoint`` captures a checkpoint at the start of every effective iteration ``e`` with ``e % K == 0`` (and at
  the first iteration); any failure sets ``e`` back to the newest one; one recovery record per failed stage;
* ``redundant`` restores exactly unless a stage fails together with its predecessor (stage ``j − 1``, and stage
  S for stage 0), which falls back to the CheckFree rule: from that iteration on the trajectory is no longer the
  no-failure one, so a replay that meets such an iteration before the target returns ``None`` and the run must be
  made for real (:func:`redundant_fallback_iterations` says where);
* after each iteration, a validation when ``e % eval_interval == 0``, and the run stops at the first validation
  loss ≤ the target, or at the wall-clock cap (censored).

tests/report/test_replay.py checks both against real runs: the evaluations, the recoveries and the wall-clock
iterations agree exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from checkfree.failures.injection import StageFailureSource


class ReplayError(ValueError):
    """The no-failure run cannot support the replay (an evaluation it lacks); one sentence says which."""


@dataclass
class Replayed:
    """What a replayed run would have recorded (the fields the report reads from a real run)."""

    strategy: str
    evals: list[tuple[int, int, float]] = field(default_factory=list)
    """(wall-clock iteration, effective iteration, validation loss) per validation, in order."""
    recoveries: list[tuple[int, int]] = field(default_factory=list)
    """(wall-clock iteration, stage) per recovered stage."""
    rollbacks: list[tuple[int, int, int]] = field(default_factory=list)
    """(wall-clock iteration, from effective, to effective) per rollback (``checkpoint`` only)."""
    saves: list[int] = field(default_factory=list)
    """Wall-clock iterations at which a checkpoint was captured (``checkpoint`` only)."""
    wall_iterations: int = 0
    """Wall-clock iterations run until the target or the cap."""
    effective_iterations: int = 0
    reached: bool = False
    failures: int = 0
    """Stage failures drawn during the wall-clock iterations run."""

    @property
    def iterations_lost(self) -> int:
        return sum(frm - to for _, frm, to in self.rollbacks)


def _val(nofail: Mapping[int, float], e: int) -> float:
    try:
        return nofail[e]
    except KeyError:
        have = f"{min(nofail)}..{max(nofail)}" if nofail else "none"
        raise ReplayError(
            f"the no-failure run has no validation at effective iteration {e} (it has {have}); "
            "replays need its validations at every eval_interval up to the target."
        ) from None


def replay_checkpoint(
    nofail: Mapping[int, float],
    failures: StageFailureSource,
    every: int,
    eval_interval: int,
    target: float,
    max_wall_iterations: int,
    max_iterations: int | None = None,
) -> Replayed:
    """Replay ``checkpoint`` (rollback to a checkpoint every ``every`` effective iterations) on the no-failure curve.

    Args:
        nofail: effective iteration → validation loss (nats) of the no-failure run, at least at every multiple of
            ``eval_interval`` until the target is reached (its iteration 0 included).
        failures: the failure source of the run (the same seed and probability as the real runs).
        every: K, effective iterations between checkpoints (≥ 1).
        target: validation loss to reach (nats).
        max_wall_iterations: the cap on wall-clock iterations (a run that hits it is censored).
        max_iterations: the cap on effective iterations (None: none).
    Raises:
        ReplayError: the no-failure run lacks a validation the replay needs.
        ValueError: ``every`` or ``eval_interval`` < 1.
    """
    if every < 1 or eval_interval < 1:
        raise ValueError(f"every {every} and eval_interval {eval_interval} must be ≥ 1.")
    out = Replayed("checkpoint")
    w = e = 0
    newest: int | None = None
    out.evals.append((0, 0, _val(nofail, 0)))
    out.reached = out.evals[-1][2] <= target
    while not out.reached and w < max_wall_iterations and (max_iterations is None or e < max_iterations):
        if newest is None or (e % every == 0 and e != newest):
            newest = e
            out.saves.append(w)
        failed = failures.draw(w)
        out.failures += len(failed)
        if failed:
            out.rollbacks.append((w, e, newest))
            out.recoveries += [(w, s) for s in failed]
            e = newest
        w, e = w + 1, e + 1
        if e % eval_interval == 0 or e == max_iterations:
            out.evals.append((w, e, _val(nofail, e)))
            out.reached = out.evals[-1][2] <= target
    out.wall_iterations, out.effective_iterations = w, e
    return out


def redundant_fallback_iterations(
    failures: StageFailureSource, n_stages: int, wall_iterations: int
) -> list[int]:
    """Wall-clock iterations < ``wall_iterations`` in which a stage fails together with its predecessor (stage
    j − 1, stage S for stage 0): there redundant computation falls back to the CheckFree rule and leaves the
    no-failure trajectory (:mod:`checkfree.recovery.redundant`)."""
    out = []
    for w in range(wall_iterations):
        failed = set(failures.draw(w))
        if any((s - 1 if s >= 1 else n_stages) in failed for s in failed):
            out.append(w)
    return out


def replay_redundant(
    nofail: Mapping[int, float],
    failures: StageFailureSource,
    n_stages: int,
    eval_interval: int,
    target: float,
    max_iterations: int,
) -> Replayed | None:
    """Replay ``redundant`` (exact restores) on the no-failure curve; None when a fallback iteration comes before
    the target (the trajectory leaves the no-failure one there: make that run for real).

    Args and errors as :func:`replay_checkpoint`; ``max_iterations`` caps the run (wall = effective here).
    """
    if eval_interval < 1:
        raise ValueError(f"eval_interval {eval_interval} must be ≥ 1.")
    out = Replayed("redundant")
    out.evals.append((0, 0, _val(nofail, 0)))
    out.reached = out.evals[-1][2] <= target
    w = 0
    while not out.reached and w < max_iterations:
        failed = failures.draw(w)
        if redundant_fallback_iterations(_Fixed(failed), n_stages, 1):
            return None
        out.failures += len(failed)
        out.recoveries += [(w, s) for s in failed]
        w += 1
        if w % eval_interval == 0 or w == max_iterations:
            out.evals.append((w, w, _val(nofail, w)))
            out.reached = out.evals[-1][2] <= target
    out.wall_iterations = out.effective_iterations = w
    return out


class _Fixed:
    """A failure source that fails ``stages`` at iteration 0 (to reuse the fallback test on one draw)."""

    def __init__(self, stages: list[int]) -> None:
        self.stages = stages

    def draw(self, iteration: int) -> list[int]:
        return list(self.stages) if iteration == 0 else []
