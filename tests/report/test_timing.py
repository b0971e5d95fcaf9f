"""The wall-clock model against hand-computed values, and the target-crossing logic."""

from __future__ import annotations

import math

import pytest

from checkfree.failures.rates import per_iteration_probability
from checkfree.report.timing import (
    PAPER_REDUNDANT_RATIO,
    IterationTimeFormula,
    RunCosts,
    TimingModel,
    crossing_iteration,
    implied_iteration_seconds,
    redundant_ratio,
    stage_parameter_count,
)

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------------------------------ formula
def test_formula_matches_hand_computation():
    # T_fwd 1 s, S 4, B 8, d 128, L 128, W 2, P_stage 100 000:
    # activations 5·8·128·128·8 B / (0.1·2³⁰ B/s) = 0.048828125 s; compute 2.5·2·1 = 5 s;
    # data parallel (2·2−1)·100000·8 / (0.2·2³⁰) = 0.011175870895385742 s.
    parts = IterationTimeFormula().components(
        1.0, n_stages=4, batch_size=8, dmodel=128, seq_l=128, world_size=2, stage_parameters=100_000
    )
    assert parts["compute"] == pytest.approx(5.0)
    assert parts["activations"] == pytest.approx(5 * 0.048828125)
    assert parts["data_parallel"] == pytest.approx(0.011175870895385742)
    assert parts["total"] == pytest.approx(5.255316495895386)


def test_formula_constants_are_parameters():
    f = IterationTimeFormula(
        backward_factor=3.0,
        waves=1.0,
        bytes_per_element=4,
        activation_bandwidth_gib_s=1.0,
        dp_bandwidth_gib_s=1.0,
    )
    # 3·(2 + 2·1·1·1·4/2³⁰) + (2·1−1)·2³⁰·4/2³⁰ = 6 + 24/2³⁰ + 4
    assert f.seconds(2.0, 1, 1, 1, 1, 1, 2**30) == pytest.approx(10.0 + 24 / 2**30)
    assert f.forward_seconds_from_compute(5.0) == pytest.approx(5.0 / 3.0)


@pytest.mark.parametrize("bad", [{"forward_seconds": -1.0}, {"world_size": 0}, {"stage_parameters": 0}])
def test_formula_rejects_bad_inputs(bad):
    args = dict(
        forward_seconds=1.0, n_stages=4, batch_size=8, dmodel=64, seq_l=32, world_size=1, stage_parameters=10
    )
    args.update(bad)
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        IterationTimeFormula().seconds(**args)


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_stage_parameter_count_matches_the_model(arch):
    import torch

    from checkfree.config import Config
    from checkfree.model import build_hf_model, split_model, stage_parameter_counts

    cfg = Config(
        architecture=arch, dmodel=64, num_heads=4, n_layers_per_stage=2, n_stages=4, seq_l=32, vocab_size=300
    )
    with torch.device("meta"):
        counts = stage_parameter_counts(split_model(build_hf_model(cfg, 300, 0), cfg))
    assert stage_parameter_count(arch, 64, 2) == counts[1] == counts[-1]


# ------------------------------------------------------------------------------------------ %/h conversion
def test_implied_iteration_seconds_inverts_the_failures_conversion():
    # 3600·ln(1−0.004)/ln(1−0.16): the 500M config's "16" key implies 82.76 s per iteration.
    assert implied_iteration_seconds(16, 0.004) == pytest.approx(82.75650543661911)
    t = implied_iteration_seconds(10, 0.002)
    assert per_iteration_probability(10, t) == pytest.approx(0.002)
    assert implied_iteration_seconds(5, 0.0) == math.inf
    with pytest.raises(ValueError, match="failure rate"):
        implied_iteration_seconds(0, 0.01)


# ------------------------------------------------------------------------------------------ the clock
def _costs(strategy="checkfree", **kw) -> RunCosts:
    return RunCosts(strategy=strategy, mb_count=4, n_stages=4, iterations=30, **kw)


def test_timeline_adds_recoveries_and_stalls_before_the_position():
    model = TimingModel.resolve(explicit_iteration_seconds=100.0, explicit_recovery_seconds=30.0)
    tl = model.timeline(
        _costs(recoveries=[(5, 0.01), (12, 0.01)], save_stalls=[(10, 2.0)], snapshot_stalls=[(25, 1.5)])
    )
    # 20 iterations · 100 s + 2 recoveries · 30 s + one 2 s save stall
    assert tl.seconds_at(20) == pytest.approx(2062.0)
    assert tl.hours_at(20) == pytest.approx(2062.0 / 3600)
    # at 12 the recovery of iteration 12 has not happened yet (it happens before iteration 12 runs)
    assert tl.seconds_at(12) == pytest.approx(1200 + 30 + 2)
    b = tl.breakdown(30)
    assert (b["recovery"], b["save_stall"], b["snapshot_stall"]) == (60.0, 2.0, 1.5)
    assert tl.seconds_at(12.5) == pytest.approx(1250 + 60 + 2)


def test_redundant_pays_the_paper_ratio_or_the_measured_one():
    model = TimingModel.resolve(explicit_iteration_seconds=91.32, explicit_recovery_seconds=0.0)
    paper = model.timeline(_costs("redundant"))
    assert paper.iteration_seconds == pytest.approx(151.04)
    assert "paper" in paper.ratio_source
    model.baseline_compute_seconds = 1.0
    measured = model.timeline(_costs("redundant", redundant_forward_seconds_per_microbatch=0.0125))
    assert measured.ratio == pytest.approx(1.2)  # 1 + 4 stages · 4 microbatches · 0.0125 s / 1 s
    assert "measured" in measured.ratio_source
    assert model.timeline(_costs("checkfree")).iteration_seconds == pytest.approx(91.32)
    assert redundant_ratio(None, 4, 1.0)[0] == pytest.approx(PAPER_REDUNDANT_RATIO)


def test_rollback_costs_its_redone_wall_iterations():
    # A checkpoint run that redid 10 iterations crosses 10 wall iterations later than it would have.
    model = TimingModel.resolve(explicit_iteration_seconds=10.0, explicit_recovery_seconds=0.0)
    costs = RunCosts.from_records(
        [{"kind": "train", "iteration": i, "seconds": 1.0} for i in range(40)]
        + [
            {"kind": "rollback", "iteration": 20, "iterations_lost": 10},
            {
                "kind": "checkpoint",
                "iteration": 10,
                "purpose": "strategy",
                "stall_seconds": 0.5,
                "bytes": 100,
            },
            {"kind": "checkpoint", "iteration": 10, "purpose": "resume", "stall_seconds": 9.0, "bytes": 100},
        ],
        {"strategy": "checkpoint", "iterations": 40},
    )
    assert (costs.iterations_lost, costs.rollbacks, costs.save_stalls, costs.save_bytes) == (
        10,
        1,
        [(10, 0.5)],
        100,
    )
    assert model.timeline(costs).seconds_at(40) == pytest.approx(400.5)


def test_resolve_priorities_and_sources():
    inputs = dict(n_stages=4, batch_size=8, dmodel=128, seq_l=128, world_size=2, stage_parameters=100_000)
    formula = TimingModel.resolve(formula_inputs=inputs, compute_seconds=2.5)  # T_fwd = 2.5 / 2.5 = 1 s
    assert formula.iteration_seconds == pytest.approx(5.255316495895386)
    assert formula.iteration_source.startswith("formula")
    # default recovery: the paper's 30 s at 91.32 s, as a ratio
    assert formula.recovery_seconds == pytest.approx(30 / 91.32 * 5.255316495895386)
    swarm = TimingModel.resolve(
        swarm_iteration_seconds=12.0, formula_inputs=inputs, compute_seconds=2.5, swarm_recovery_seconds=4.0
    )
    assert (swarm.iteration_seconds, swarm.recovery_seconds) == (12.0, 4.0)
    assert "swarm" in swarm.iteration_source and "swarm" in swarm.recovery_source
    given = TimingModel.resolve(explicit_iteration_seconds=7.0, swarm_iteration_seconds=12.0)
    assert given.iteration_seconds == 7.0
    with pytest.raises(ValueError, match="iteration time"):
        TimingModel.resolve(explicit_iteration_seconds=-1.0)
    with pytest.raises(ValueError, match="T_fwd"):
        TimingModel.resolve(formula_inputs=inputs)


# ------------------------------------------------------------------------------------------ crossing
def test_crossing_never_reached_reports_the_best():
    c = crossing_iteration([(0, 8.0), (10, 6.0), (20, 5.5)], target=5.0)
    assert not c.reached and c.iteration is None
    assert (c.best_loss, c.best_iteration) == (5.5, 20)


def test_crossing_between_evaluations_is_interpolated():
    c = crossing_iteration([(0, 8.0), (10, 6.0), (20, 4.0), (30, 3.0)], target=5.0)
    assert c.reached and c.interpolated
    assert c.iteration == pytest.approx(15.0)  # 10 + (6−5)/(6−4)·10


def test_crossing_at_an_evaluation_and_at_the_start():
    c = crossing_iteration([(0, 8.0), (10, 5.0)], target=5.0)
    assert c.iteration == 10 and not c.interpolated
    assert crossing_iteration([(0, 4.0), (10, 3.0)], target=5.0).iteration == 0


def test_crossing_ignores_nan_and_unsorted_input():
    c = crossing_iteration([(20, 4.0), (0, 8.0), (10, "nan")], target=5.0)
    assert c.iteration == 20 and not c.interpolated  # no finite point between 0 and 20 to interpolate from
    assert not crossing_iteration([(0, "inf"), (10, float("nan"))], target=5.0).reached
