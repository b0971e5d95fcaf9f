"""The Table 2 study's report features: per-seed targets (``--target-loss nofail@N``), censored runs, the Wilcoxon
test beside the sign test, and the pure cost of swapping paired by seed (paper Fig. 4c)."""

from __future__ import annotations

import json
import math

import pytest

from checkfree import jsonio
from checkfree.report.analysis import TimingOptions, fig4c_verdict, resolve_targets
from checkfree.report.build import build_report
from checkfree.report.runs import load_runs
from checkfree.report.stats import sign_test_p, wilcoxon_p

from helpers.report import make_run

TIMING = TimingOptions(iteration_seconds=3600.0, recovery_seconds=0.0)  # one hour per iteration


def _study(root):
    """Three seeds at 16 %/h: no-failure runs with and without swaps, CheckFree+ reaching each seed's target at
    20, 30 and never (censored at 40), checkpointing at 30, 35 and 40."""
    nf = {0: 5.0, 1: 5.5, 2: 4.0}  # each seed's loss at iteration 20: its target
    for seed, at20 in nf.items():
        make_run(root, f"nf-s{seed}", "no_failure", [(0, 8.0), (10, 6.0), (20, at20)], seed=seed)
        make_run(
            root,
            f"nfs-s{seed}",
            "no_failure",
            [(0, 8.0), (10, 6.2), (20, at20 + 0.5), (30, at20 - 0.1)],
            swaps=True,
            seed=seed,
        )
    plus = {
        0: [(0, 8.0), (10, 6.0), (20, nf[0])],
        1: [(0, 8.0), (20, 6.0), (30, nf[1])],
        2: [(0, 8.0), (40, 4.4)],
    }
    ckpt = {0: 30, 1: 35, 2: 40}
    for seed in nf:
        make_run(root, f"cfp-s{seed}", "checkfree_plus", plus[seed], swaps=True, failures=(5,), seed=seed)
        make_run(
            root, f"ckpt-s{seed}", "checkpoint", [(0, 8.0), (ckpt[seed], nf[seed])], failures=(5,), seed=seed
        )
    return root


def test_nofail_targets_are_per_seed_and_refused_without_a_validation_there(tmp_path):
    runs, _, _ = load_runs([_study(tmp_path / "runs")])
    targets = resolve_targets(runs, "nofail@20")
    assert targets.of("tiny_config", 0, 1) == 5.0 and targets.of("tiny_config", 2, 1) == 4.0
    assert targets.of("tiny_config", 7, 1) is None  # a seed without its no-failure run has no target
    assert "seed 1 (W 1): **5.5000**" in targets.describe()
    with pytest.raises(
        ValueError, match="no no-failure run without swaps has a validation at effective iteration 15"
    ):
        resolve_targets(runs, "nofail@15")
    with pytest.raises(ValueError, match="expected a number, 'auto' or 'nofail@N'"):
        resolve_targets(runs, "nofail@x")


def test_table2_section_lists_censored_runs_and_tests_orderings_two_ways(tmp_path):
    res = build_report([_study(tmp_path / "runs")], "nofail@20", tmp_path / "out", TIMING, plots=False)
    hours = {(r.run.strategy, g.seed): r.hours_to_target for g in res.groups for r in g.rows}
    assert hours[("checkfree_plus", 0)] == 20.0 and hours[("checkfree_plus", 2)] is None
    assert hours[("checkpoint", 1)] == 35.0
    text = res.report.read_text()
    assert "Censored runs (1): stopped at their cap before the target." in text
    assert "| 16 %/h (p_iter 0.01) | CheckFree+ | 2 | `cfp-s2` | 40 | 4.4000 |" in text
    assert "s2 censored (4.4000 at it. 40)" in text
    # CheckFree+ < checkpointing holds in seeds 0 and 1; in seed 2 CheckFree+ is censored and checkpointing
    # reached the target, so it does not hold there
    assert "CheckFree+ < checkpointing | holds in 2 of 3 (p = 0.5)" in text
    assert f"p = {wilcoxon_p([10.0, 5.0]):.3g} (n = 2)" in text  # checkpoint − CheckFree+ over seeds 0, 1


def test_swap_cost_pairs_runs_of_different_lengths_by_seed(tmp_path):
    res = build_report([_study(tmp_path / "runs")], "nofail@20", tmp_path / "out", TIMING, plots=False)
    text = res.report.read_text()
    assert "## The pure cost of swapping (paper Fig. 4c)" in text
    # seed 0: swaps cross 5.0 between (20, 5.5) and (30, 4.9): at 20 + 0.5 / 0.6 · 10
    assert (
        f"| 0 | 20.0 | {20 + 0.5 / 0.6 * 10:.1f} | {(20 + 0.5 / 0.6 * 10) / 20:.3f} | 20 | +0.5000 |" in text
    )
    assert f"swaps behind in 3 of 3 seeds (sign test p = {sign_test_p(3, 3):.3g}" in text
    runs, _, _ = load_runs([tmp_path / "runs"])
    verdicts = fig4c_verdict(runs)  # the no-swap runs stop at 20, the swap runs at 30: compared at 20
    assert [v.holds for v in verdicts] == [True, True, True]
    assert "validation loss at iteration 20" in verdicts[0].evidence


def test_statistics_come_from_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    assert sign_test_p(5, 5) == pytest.approx(1 / 32)
    assert wilcoxon_p([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(1 / 32)  # all 5 ranks positive: exact 1/2^5
    assert wilcoxon_p([0.0, 0.0]) is None
    want = scipy_stats.wilcoxon([3.0, -1.0, 2.0], alternative="greater").pvalue
    assert wilcoxon_p([3.0, -1.0, 2.0]) == pytest.approx(want)


@pytest.mark.parametrize(
    "stopped",
    [
        None,  # still running, or killed: no summary.json
        {"status": "interrupted", "cause": "SIGTERM"},  # a stopped run writes one (checkfree.sim.launch)
        {"status": "failed", "cause": "RuntimeError: boom"},  # so does a crash: no ``ended_by``
    ],
    ids=["no-summary", "sigterm", "crash"],
)
def test_a_run_that_has_not_ended_is_left_out_not_counted_as_censored(tmp_path, stopped):
    root = _study(tmp_path / "runs")
    summary = root / "cfp-s2" / "summary.json"
    if stopped is None:
        summary.unlink()
    else:
        summary.write_text(json.dumps({**json.loads(summary.read_text()), **stopped}))
    res = build_report([root], "nofail@20", tmp_path / "out", TIMING, plots=False)
    text = res.report.read_text()
    assert "Censored runs" not in text and "s2 censored" not in text
    assert (
        "Incomplete runs (1), left out as missing (not ended: still running, killed, stopped or crashed): `cfp-s2`."
        in text
    )
    # seed 2 is not judged: its CheckFree+ run has not ended (before: judged as CheckFree+ slower)
    assert "CheckFree+ < checkpointing | holds in 2 of 2 (p = 0.25)" in text


def test_a_rate_run_with_fewer_seeds_expects_only_its_own(tmp_path):
    """Issue 31's design: 5 seeds at 5 %/h, 3 at 10 and 16 %/h. A rate's seeds are those with a run at that rate:
    10 %/h here has seeds 0 and 1 and must not read "runs missing: seed 2" (before: the family's seeds 0–2)."""
    root = _study(tmp_path / "runs")
    for seed in (0, 1):
        for name, strategy, at in (("cfp", "checkfree_plus", 20), ("ckpt", "checkpoint", 30)):
            evals = [(0, 8.0), (at, {0: 5.0, 1: 5.5}[seed])]
            make_run(
                root,
                f"{name}-r10-s{seed}",
                strategy,
                evals,
                rate=10.0,
                p=0.006,
                failures=(5,),
                seed=seed,
                swaps=strategy == "checkfree_plus",
            )
    text = build_report([root], "nofail@20", tmp_path / "out", TIMING, plots=False).report.read_text()
    table = text.split("## Table 2 at this scale", 1)[1]
    assert (
        "its own seeds, those with a run at that rate: 5 %/h seeds 0, 1, 2 (no run); 10 %/h seeds 0, 1; "
        "16 %/h seeds 0, 1, 2." in table
    )
    ten = [line for line in table.splitlines() if line.startswith("| 10 %/h")]
    assert ten and not any("s2" in line or "seed 2" in line for line in ten), ten
    assert "| 10 %/h (p_iter 0.006) | CheckFree+ | 2 of 2 | 2 of 2 |" in table
    assert "| 10 %/h (p_iter 0.006) | checkpointing ÷ CheckFree+ | 1.5 ± " in table  # 30 / 20 in both seeds
    assert "| 16 %/h (p_iter 0.01) | CheckFree+ | 3 of 3 | 2 of 3 |" in table  # 16 %/h keeps its three seeds
    sensitivity = table.split("#### Sensitivity", 1)[1].split("###", 1)[0]
    assert "| 10 %/h (p_iter 0.006) | checkpointing ÷ CheckFree+ | 1.5 ± 0 (2 of 2 seeds) |" in sensitivity


# ------------------------------------------------------------------ the rules the verdicts rest on, pinned (issue 40)
def test_the_nofail_target_is_the_run_without_swaps_even_when_the_swap_run_sorts_first(tmp_path):
    root = _study(tmp_path / "runs")
    for seed in range(3):  # "a-…" sorts before "nf-…": the swap run comes first by name
        (root / f"nfs-s{seed}").rename(root / f"a-nfs-s{seed}")
    runs, _, _ = load_runs([root])
    targets = resolve_targets(runs, "nofail@20")
    assert [targets.of("tiny_config", s, 1) for s in range(3)] == [5.0, 5.5, 4.0]  # not 5.5, 6.0, 4.5


def test_a_run_ended_at_max_wall_iterations_is_censored_not_left_out(tmp_path):
    root = _study(tmp_path / "runs")
    summary = root / "cfp-s2" / "summary.json"
    ended = {"status": "failed", "ended_by": "max_wall_iterations", "stopped": "stopped at wall-clock 40"}
    summary.write_text(json.dumps({**json.loads(summary.read_text()), **ended}))
    text = build_report([root], "nofail@20", tmp_path / "out", TIMING, plots=False).report.read_text()
    assert "s2 censored (4.4000 at it. 40)" in text and "Incomplete runs" not in text
    assert (
        "CheckFree+ < checkpointing | holds in 2 of 3 (p = 0.5)" in text
    )  # seed 2 judged: CheckFree+ slower


def test_a_seed_whose_loss_diverged_voids_the_loss_interval_and_is_named(tmp_path):
    root = _study(tmp_path / "runs")
    summary = root / "ckpt-s1" / "summary.json"
    data = json.loads(summary.read_text())
    data["final_eval"]["val_loss"] = math.nan
    summary.write_text(jsonio.dumps(data))  # as the simulator writes a diverged run's loss
    text = build_report([root], "nofail@20", tmp_path / "out", TIMING, plots=False).report.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| 16 %/h (p_iter 0.01) | checkpointing |"))
    assert "| — (not finite in s1) |" in row  # not the mean of seeds 0 and 2
    assert "| checkpoint | 3 | — (not finite in seeds 1) |" in text  # the across-seeds table too


def test_wilcoxon_drops_zero_differences_as_docs_reports_md_says():
    pytest.importorskip("scipy.stats")
    assert wilcoxon_p([0.0, 0.0, 1.0, 2.0, 3.0]) == pytest.approx(wilcoxon_p([1.0, 2.0, 3.0])) == 0.125
    # past 50 differences scipy uses the normal approximation, where keeping the zeros (Pratt's or a split of
    # their ranks) moves p: 1.2e-9 with them dropped, 1.0e-10 with them split, 9.9e-11 with Pratt's
    ranks = [float(i) for i in range(1, 60)] + [-30.0, -40.0, -50.0]
    assert wilcoxon_p([0.0] * 10 + ranks) == pytest.approx(wilcoxon_p(ranks), rel=1e-9)


def test_ratios_and_orderings_pair_runs_by_seed(tmp_path):
    text = build_report([_study(tmp_path / "runs")], "nofail@20", tmp_path / "out", TIMING, plots=False)
    text = text.report.read_text()
    # checkpointing 30, 35, 40 h against CheckFree+ 20, 30, censored: 1.5 and 1.17, never 30/30 or 35/20
    assert (
        "| checkpointing ÷ CheckFree+ | 1.33 ± 2.12 (2 of 3 seeds; censored: s2) | s0 1.5, s1 1.17; "
        "s2: checkfree_plus never reached |" in text
    )
