"""Iterations to recover against a paired no-failure run's noise band, and the report's recoveries table."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkfree.report.recoveries import Reference, iterations_to_recover, recovery_rows, section
from checkfree.report.runs import Run

pytestmark = pytest.mark.timeout(60)


def run(name: str, strategy: str, losses: list[float], recoveries: list[dict] | None = None) -> Run:
    records = [
        {"kind": "train", "iteration": i, "effective_iteration": i, "loss": v} for i, v in enumerate(losses)
    ]
    records += [{"kind": "recovery", "strategy": strategy, **r} for r in recoveries or []]
    return Run(
        Path(name),
        {"strategy": strategy, "world_size": 1, "config": "tiny_config.json"},
        {"seed": 0},
        {"setting": strategy},
        records,
    )


NOISE = [4.05 if i % 2 == 0 else 3.95 for i in range(60)]  # mean 4.0, σ 0.05 around a trailing mean of 10


def test_band_and_smoothing_by_hand():
    ref = Reference.of(run("nf", "no_failure", NOISE))
    assert ref.band == pytest.approx(
        2 * 0.05, rel=1e-3
    )  # 2 σ (51 residuals: 26 of one sign, 25 of the other)
    assert ref.smoothed[30] == pytest.approx(4.0)
    spiked = [v + (0.6 if 20 <= i < 30 else 0.0) for i, v in enumerate(NOISE)]
    # since the failure at 20 the trailing mean holds 10 − k spiked values at iteration 29 + k: 0.06 excess first
    # falls within the 0.1 band at k = 9, iteration 38 (at 37 two spiked values give 0.12 > 0.1)
    assert iterations_to_recover(run("cf", "checkfree", spiked), 20, ref) == 18
    stuck = [v + (0.6 if i >= 20 else 0.0) for i, v in enumerate(NOISE)]
    assert iterations_to_recover(run("cf", "checkfree", stuck), 20, ref) is None
    assert iterations_to_recover(run("cf", "checkfree", NOISE), 20, ref) == 0


def test_recoveries_table_medians_and_reference_pairing():
    spiked = [v + (0.6 if 20 <= i < 30 else 0.0) for i, v in enumerate(NOISE)]
    recs = [
        {"iteration": 20, "stage": 2, "rule": "checkfree", "loss_spike": 0.5, "weight_rel_l2": 0.3},
        {"iteration": 50, "stage": 3, "rule": "checkfree", "loss_spike": 0.1, "weight_rel_l2": 0.1},
    ]
    runs = [run("nf", "no_failure", NOISE), run("cf", "checkfree", spiked, recs)]
    rows = recovery_rows(runs)
    assert [r.iterations for r in rows] == [18, 0]
    text = "\n".join(section(runs))
    assert "| checkfree | 2 | 0.3 | 0.2 | 2 of 2 | 9 |" in text
    alone = "\n".join(section(runs[1:]))
    assert "no no-failure reference" in alone
