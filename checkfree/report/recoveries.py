"""Per-recovery evidence in the report: the accounting fields of each recovery record and how many iterations the
run took to get back to its paired no-failure run.

**Iterations to recover.** For a recovery at wall-clock iteration f, the run's *smoothed* training loss at a later
iteration i is the mean of its training losses over the iterations f..i, at most the last :data:`WINDOW` of them
(the smoothing restarts at the failure, so losses from before it cannot hide the spike). The paired no-failure
run (same config, model seed and world size; same swaps setting when one exists) gives the reference: its own
trailing mean over :data:`WINDOW` iterations at the same effective iteration, and a noise band of
:data:`BAND_SIGMAS` standard deviations of its raw loss around that mean. The run has recovered at the first i
where smoothed loss ≤ reference + band; ``iterations_to_recover`` = i − f, or None ("not recovered by the end").
Later failures do not reset the count.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from checkfree.report.runs import Run

WINDOW = 10
"""Training iterations in the trailing mean of the smoothed loss."""
BAND_SIGMAS = 2.0
"""Half-width of the no-failure run's noise band, in standard deviations of its loss around its trailing mean."""


def _losses(run: Run) -> list[tuple[int, int, float]]:
    """(wall iteration, effective iteration, training loss) in file order, finite losses only."""
    out = []
    for r in run.kind("train"):
        loss = r.get("loss")
        if isinstance(loss, int | float) and math.isfinite(loss) and "iteration" in r:
            out.append((int(r["iteration"]), int(r.get("effective_iteration", r["iteration"])), float(loss)))
    return out


@dataclass
class Reference:
    """A no-failure run's smoothed loss by effective iteration and its noise band (nats)."""

    smoothed: dict[int, float]
    band: float

    @classmethod
    def of(cls, run: Run, window: int = WINDOW, sigmas: float = BAND_SIGMAS) -> Reference | None:
        points = _losses(run)
        if len(points) <= window:
            return None
        smoothed, residuals = {}, []
        for k, (_, eff, loss) in enumerate(points):
            recent = [p[2] for p in points[max(0, k - window + 1) : k + 1]]
            smoothed[eff] = sum(recent) / len(recent)
            if k >= window - 1:
                residuals.append(loss - smoothed[eff])
        return cls(smoothed, sigmas * statistics.pstdev(residuals))


def reference_run(run: Run, runs: list[Run]) -> Run | None:
    """The no-failure run paired with ``run``: same config, model seed and world size; same swaps preferred."""
    seed = run.config.get("seed")
    refs = [
        r
        for r in runs
        if r.strategy == "no_failure"
        and r.config_name == run.config_name
        and r.config.get("seed") == seed
        and r.world_size == run.world_size
    ]
    refs.sort(key=lambda r: (r.swaps != run.swaps, r.name))
    return refs[0] if refs else None


def iterations_to_recover(
    run: Run, failure_iteration: int, ref: Reference, window: int = WINDOW
) -> int | None:
    """Iterations after ``failure_iteration`` until the smoothed loss is back in the band (module docstring)."""
    after = [p for p in _losses(run) if p[0] >= failure_iteration]
    for k, (it, eff, _) in enumerate(after):
        recent = [p[2] for p in after[max(0, k - window + 1) : k + 1]]
        target = ref.smoothed.get(eff)
        if target is not None and sum(recent) / len(recent) <= target + ref.band:
            return it - failure_iteration
    return None


@dataclass
class RecoveryRow:
    """One recovery record of one run, with its accounting and time to recover."""

    run: Run
    record: dict[str, Any]
    iterations: int | None
    has_reference: bool

    @property
    def rule(self) -> str:
        return str(self.record.get("rule", "?"))


def recovery_rows(runs: list[Run]) -> list[RecoveryRow]:
    """Every recovery record of every failing run, with ``iterations_to_recover`` where a reference exists."""
    out = []
    for run in runs:
        if run.strategy == "no_failure":
            continue
        ref_run = reference_run(run, runs)
        ref = Reference.of(ref_run) if ref_run is not None else None
        for rec in run.kind("recovery"):
            its = iterations_to_recover(run, int(rec.get("iteration", 0)), ref) if ref is not None else None
            out.append(RecoveryRow(run, rec, its, ref is not None))
    return out


def _median(values: list[float]) -> str:
    vals = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return f"{statistics.median(vals):.4g}" if vals else "—"


def section(runs: list[Run]) -> list[str]:
    """Markdown: per strategy, median loss spike, iterations to recover and weight distance."""
    rows = recovery_rows(runs)
    if not rows:
        return []
    lines = [
        "## Recoveries",
        "",
        f"Per recovery: the probe-batch loss spike (after − before, nats), the relative L2 distance of the rebuilt "
        f"stage to the lost one, and the iterations until the training loss (trailing mean over ≤ {WINDOW} "
        f"iterations since the failure) is back within {BAND_SIGMAS:g} σ of the paired no-failure run's trailing "
        "mean. Medians; the iterations median is over the recoveries that got back.",
        "",
        "| strategy | recoveries | median loss spike | median weight rel. L2 | recovered | median iterations to recover |",
        "|---|---|---|---|---|---|",
    ]
    by: dict[str, list[RecoveryRow]] = {}
    for r in rows:
        by.setdefault(r.run.label, []).append(r)
    for label, rs in by.items():
        judged = [r for r in rs if r.has_reference]
        back = [r.iterations for r in judged if r.iterations is not None]
        recovered = f"{len(back)} of {len(judged)}" if judged else "no no-failure reference"
        lines.append(
            f"| {label} | {len(rs)} | {_median([r.record.get('loss_spike') for r in rs])} | "
            f"{_median([r.record.get('weight_rel_l2') for r in rs])} | {recovered} | {_median(back)} |"
        )
    if not any("loss_spike" in r.record for r in rows):
        lines += [
            "",
            "These runs carry no accounting fields (run without `--no-recovery-accounting` to get them).",
        ]
    return lines + [""]
