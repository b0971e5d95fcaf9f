"""Paper Table 2 in the report: pairwise orderings over seeds, paired ratios beside the paper's, and their
sensitivity to the recovery cost, on synthetic runs whose hours are known by hand."""

from __future__ import annotations

import pytest

from checkfree.report.analysis import TimingOptions
from checkfree.report.build import build_report
from checkfree.report.stats import mean_ci, wilcoxon_p
from checkfree.report.table2 import paper_ratio
from checkfree.report.timing import TimingModel

from helpers.report import make_run

pytestmark = pytest.mark.timeout(120)

T_ITER, RECOVERY, TARGET = 100.0, 30.0, 5.0
P = {5.0: 0.003, 10.0: 0.006, 16.0: 0.01}

# (rate, seed) → strategy → (wall iteration where the loss reaches 5.0 or None = never, recoveries before it)
PLAN = {
    (5.0, 0): {"checkpoint": (40, 1), "redundant": (30, 0), "checkfree": (21, 0), "checkfree_plus": (20, 4)},
    (5.0, 1): {"checkpoint": (50, 1), "redundant": (30, 0), "checkfree": (22, 0), "checkfree_plus": (20, 6)},
    (16.0, 0): {"checkpoint": (60, 2), "redundant": (30, 0), "checkfree": (45, 2), "checkfree_plus": (40, 2)},
    (16.0, 1): {"checkpoint": (80, 2), "redundant": (30, 0), "checkfree": (50, 2), "checkfree_plus": (40, 1)},
    (16.0, 2): {
        "checkpoint": (70, 2),
        "redundant": (30, 0),
        "checkfree": (55, 2),
        "checkfree_plus": (None, 2),
    },
}


def hours(cross: int, recoveries: int, factor: float = 1.0) -> float:
    """The timing model by hand: iterations × T_iter + recoveries × the recovery seconds × factor."""
    return (cross * T_ITER + recoveries * RECOVERY * factor) / 3600


def plan_runs(root):
    for (rate, seed), strategies in PLAN.items():
        for strategy, (cross, n_rec) in strategies.items():
            end = 100
            evals = [(0, 8.0), (cross, TARGET), (end, 4.5)] if cross else [(0, 8.0), (end, 5.5)]
            make_run(
                root,
                f"r{rate:g}-{strategy}-s{seed}",
                strategy,
                evals,
                rate=rate,
                p=P[rate],
                seed=seed,
                swaps=strategy == "checkfree_plus",
                failures=tuple(range(1, n_rec + 1)),  # every recovery happens before the crossing
                # a measured redundant forward of 0 s: redundant computation costs T_iter, no paper ratio
                stats={"redundant_forward_seconds_per_microbatch": 0.0} if strategy == "redundant" else None,
            )


def expected_ratio(rate, numerator, factor=1.0):
    """Per-seed checkpoint-or-redundant ÷ CheckFree+ where both reached, by hand."""
    out = []
    for (r, _), plan in PLAN.items():
        if r == rate and plan["checkfree_plus"][0] is not None:
            out.append(hours(*plan[numerator], factor) / hours(*plan["checkfree_plus"], factor))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("t2")
    plan_runs(tmp / "runs")
    return build_report(
        [tmp / "runs"],
        TARGET,
        tmp / "out",
        TimingOptions(iteration_seconds=T_ITER, recovery_seconds=RECOVERY),
        plots=False,
    )


def _line(text: str, *cells: str) -> str:
    """The one table line that holds every cell, in order."""
    hits = [
        ln for ln in text.splitlines() if ln.startswith("| " + cells[0] + " |") and " | ".join(cells) in ln
    ]
    assert len(hits) == 1, (cells, hits)
    return hits[0]


def test_paper_ratios_are_table2s_headline():
    assert f"{paper_ratio('checkpoint', 'checkfree_plus', 5.0):.2f}" == "1.57"
    assert f"{paper_ratio('redundant', 'checkfree_plus', 5.0):.2f}" == "1.18"
    assert f"{paper_ratio('checkpoint', 'checkfree_plus', 10.0):.2f}" == "1.69"
    assert f"{paper_ratio('redundant', 'checkfree_plus', 10.0):.2f}" == "1.14"
    assert f"{paper_ratio('checkpoint', 'checkfree_plus', 16.0):.2f}" == "1.38"
    assert f"{paper_ratio('redundant', 'checkfree_plus', 16.0):.2f}" == "0.91"
    with pytest.raises(KeyError):
        paper_ratio("checkpoint", "checkfree_plus", 7.0)


def test_recovery_factor_scales_only_the_recovery():
    m = TimingModel.resolve(explicit_iteration_seconds=100.0, explicit_recovery_seconds=30.0)
    half = m.with_recovery_factor(0.5)
    assert (half.iteration_seconds, half.recovery_seconds) == (100.0, 15.0) and m.recovery_seconds == 30.0
    assert "×0.5 of 30 s" in half.recovery_source
    with pytest.raises(ValueError, match="recovery factor"):
        m.with_recovery_factor(-1.0)


def test_pairwise_orderings_are_verdicts_over_seeds(report):
    by = {}
    for v in report.verdicts:
        by.setdefault(v.statement, []).append(v)
    at5 = {
        s: [v for v in vs if v.scope[1] == P[5.0]] for s, vs in by.items()
    }  # 16 %/h has these orderings too
    plus_ckpt = at5["Table 2: hours to target CheckFree+ < checkpointing"]
    assert sorted(v.seed for v in plus_ckpt) == [0, 1] and all(v.holds for v in plus_ckpt)
    # at ×1: CheckFree+ 2000 + 4·30 = 2120 s > CheckFree 2100 s in seed 0; 2000 + 6·30 = 2180 s < 2200 s in seed 1
    plus_cf = {v.seed: v.holds for v in at5["Table 2: hours to target CheckFree+ < CheckFree"]}
    assert plus_cf == {0: False, 1: True}
    # at 16 %/h the paper's Table 2 orders every pair too (redundant < CheckFree+ < CheckFree < checkpointing)
    plus_ckpt16 = {
        v.seed: v.holds
        for v in by["Table 2: hours to target CheckFree+ < checkpointing"]
        if v.scope[1] == P[16.0]
    }
    assert plus_ckpt16 == {0: True, 1: True, 2: False}  # seed 2: CheckFree+ never reached, checkpointing did
    red_plus = {v.seed: v.holds for v in by["Table 2: hours to target redundant computation < CheckFree+"]}
    assert red_plus == {0: True, 1: True, 2: True}  # seed 2: CheckFree+ never reached, redundant did
    assert len(by["Table 2: redundant computation has the shortest time to target"]) == 3
    text = report.report.read_text()
    assert (
        "- Table 2: hours to target CheckFree+ < CheckFree (tiny_config, 5 %/h (p_iter 0.003), world size 1): "
        "**holds in 1 of 2 seeds** (sign test p = 0.75; seeds 0, 1)."
    ) in text
    # the Wilcoxon cell: slower − faster hours over the seeds where both reached
    cf_minus_plus = [
        hours(*PLAN[(5.0, s)]["checkfree"]) - hours(*PLAN[(5.0, s)]["checkfree_plus"]) for s in (0, 1)
    ]
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "CheckFree+ < CheckFree",
        "holds in 1 of 2 (p = 0.75)",
        f"p = {wilcoxon_p(cf_minus_plus):.3g} (n = 2)",
        "—",  # 5 %/h has runs in seeds 0 and 1 only: seed 2 is not one of its seeds
    )
    ckpt_minus_cf = [
        hours(*PLAN[(5.0, s)]["checkpoint"]) - hours(*PLAN[(5.0, s)]["checkfree"]) for s in (0, 1)
    ]
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "CheckFree < checkpointing",
        "holds in 2 of 2 (p = 0.25)",
        f"p = {wilcoxon_p(ckpt_minus_cf):.3g} (n = 2)",
        "—",
    )
    _line(
        text,
        "16 %/h (p_iter 0.01)",
        "redundant computation < checkpointing",
        "holds in 3 of 3 (p = 0.125)",
        "p = 0.125 (n = 3)",
        "—",
    )
    _line(text, "10 %/h", "every ordering", "not judged", "—", "runs missing: seeds 0, 1, 2")
    assert (
        "judged over its own seeds, those with a run at that rate: 5 %/h seeds 0, 1; "
        "10 %/h seeds 0, 1, 2 (no run); 16 %/h seeds 0, 1, 2." in text
    )


def test_strategy_table_and_ratios_beside_the_paper(report):
    text = report.report.read_text()
    ckpt5 = [hours(40, 1), hours(50, 1)]
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "checkpointing",
        "2 of 2",  # the rate's own seeds (0, 1), not the family's (0, 1, 2)
        "2 of 2",
        f"{mean_ci(ckpt5).format('.4g')} (2 seeds)",
        f"s0 {ckpt5[0]:.4g}, s1 {ckpt5[1]:.4g} |",
    )
    plus16 = sorted(hours(*PLAN[(16.0, s)]["checkfree_plus"]) for s in (0, 1))  # seed 2 never reached
    _line(
        text,
        "16 %/h (p_iter 0.01)",
        "CheckFree+",
        "3 of 3",
        "2 of 3",
        f"median {sum(plus16) / 2:.4g} of the 2 that reached, {plus16[0]:.4g}–{plus16[1]:.4g}; censored: s2",
    )
    assert (
        "| 16 %/h (p_iter 0.01) | CheckFree+ | 2 | `r16-checkfree_plus-s2` | 100 | 5.5000 |" in text
    )  # censored
    _line(text, "10 %/h", "CheckFree+", "0 of 3 (runs missing)")
    fam = report.table2.families[0]
    r16 = next(r for r in fam.rates if r.rate == 16.0)
    ckpt16 = expected_ratio(16.0, "checkpoint")  # seeds 0 and 1; seed 2's CheckFree+ never reached
    ratio = r16.ratios[0]
    assert (ratio.numerator, ratio.denominator, ratio.reached) == ("checkpoint", "checkfree_plus", 2)
    assert ratio.interval.mean == pytest.approx(sum(ckpt16) / 2)
    assert ratio.interval.half_width == pytest.approx(mean_ci(ckpt16).half_width)
    assert ratio.per_seed[2] == "checkfree_plus never reached"
    iv = mean_ci(ckpt16)
    _line(
        text,
        "16 %/h (p_iter 0.01)",
        "checkpointing ÷ CheckFree+",
        f"{iv.format('.3g')} (2 of 3 seeds; censored: s2)",
        f"s0 {ckpt16[0]:.3g}, s1 {ckpt16[1]:.3g}; s2: checkfree_plus never reached",
        "1.38",
    )
    # CheckFree ÷ CheckFree+ (what the swaps gain), paired by seed, beside the paper's 367.81 / 355.13
    cf5 = expected_ratio(5.0, "checkfree")
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "CheckFree ÷ CheckFree+",
        f"{mean_ci(cf5).format('.3g')} (2 of 2 seeds)",
        f"s0 {cf5[0]:.3g}, s1 {cf5[1]:.3g}",
        f"{367.81 / 355.13:.3g}",
    )
    red5 = expected_ratio(5.0, "redundant")
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "redundant computation ÷ CheckFree+",
        f"{mean_ci(red5).format('.3g')} (2 of 2 seeds)",
        f"s0 {red5[0]:.3g}, s1 {red5[1]:.3g}",
        "1.18",
    )
    _line(
        text, "10 %/h", "checkpointing ÷ CheckFree+", "— (0 of 3 seeds)", "s0, s1, s2: runs missing", "1.69"
    )


def test_sensitivity_to_the_recovery_cost(report):
    text = report.report.read_text()
    assert "T_iter = 100 s per iteration in every column (given: 100 s)" in text
    assert "×0.5 = 15 s, ×1 = 30 s, ×2 = 60 s" in text
    assert "| rate | ordering / ratio | ×0.5 (15 s) | ×1 (30 s) | ×2 (60 s) |" in text
    # CheckFree+ (20 iterations, 4 and 6 recoveries) against CheckFree (21 and 22 iterations, none):
    # ×0.5: 2060 < 2100, 2090 < 2200; ×1: 2120 > 2100, 2180 < 2200; ×2: 2240 > 2100, 2360 > 2200
    _line(
        text,
        "5 %/h (p_iter 0.003)",
        "CheckFree+ < CheckFree",
        "holds in 2 of 2 (p = 0.25)",
        "holds in 1 of 2 (p = 0.75)",
        "holds in 0 of 2 (p = 1)",
    )
    cells = []
    for f in (0.5, 1.0, 2.0):
        r = expected_ratio(5.0, "checkpoint", f)
        cells.append(f"{mean_ci(r).format('.3g')} (2 of 2 seeds)")
    _line(text, "5 %/h (p_iter 0.003)", "checkpointing ÷ CheckFree+", *cells)
    _line(text, "10 %/h", "every ordering and ratio", "runs missing", "runs missing", "runs missing")
    # the ×1 column is the report itself
    for f, fams in report.table2.by_factor.items():
        assert fams[0].model.recovery_seconds == RECOVERY * f and fams[0].model.iteration_seconds == T_ITER
    by1 = report.table2.by_factor[1.0][0]
    assert by1 is report.table2.families[0]
