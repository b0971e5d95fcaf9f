"""The exact baselines by replay (checkfree/report/replay.py): checkpointing's and redundant computation's real
runs train the no-failure trajectory bit for bit, and the replay reproduces their validations, recoveries and
wall-clock iterations exactly."""

from __future__ import annotations

import json
import shutil

import pytest

from checkfree.failures.injection import StageFailureInjector
from checkfree.report.analysis import TimingOptions
from checkfree.report.build import build_report
from checkfree.report.replay import (
    ReplayError,
    redundant_fallback_iterations,
    replay_checkpoint,
    replay_redundant,
)
from checkfree.telemetry.metrics import read_metrics

from helpers import ScriptedFailures
from helpers.cli import run_cli, simulate_argv

P = "0.08"  # 4 stages: ≈ 0.28 of the iterations lose a stage
RATE_ARGS = ("--failure-probability", P, "--seed", "3")
P_AUTHORS = "0.15"  # with K_p = 6 (2 paper iterations per iteration) and seed 3: a boundary at 3 and 12, lost
AUTHORS_ARGS = ("--failure-probability", P_AUTHORS, "--seed", "3", "--set", "checkpoint_rule=authors")
AUTHORS_ARGS += ("--set", "checkpoint_paper_interval=6", "--set", "checkpoint_every=3")


def _evals(run_dir):
    return [
        (r["iteration"], r["effective_iteration"], r["val_loss"])
        for r in read_metrics(run_dir / "metrics.jsonl")
        if r["kind"] == "eval"
    ]


class _NoCapture:
    """What :func:`helpers.cli.run_cli` reads its output from, for a module-scoped fixture (no capsys there)."""

    def readouterr(self) -> tuple[str, str]:
        return "", ""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A no-failure run, then checkpoint, redundant and CheckFree runs on the same failure draws that stop at the
    no-failure run's validation loss at iteration 12 (or at 40 wall-clock iterations)."""
    root = tmp_path_factory.mktemp("replay") / "runs"
    out = {}
    cap = _NoCapture()
    rc, _, _ = run_cli(simulate_argv(root / "nofail", *RATE_ARGS, setting="no_failure", iterations=12), cap)
    assert rc == 0
    out["nofail"] = root / "nofail"
    target = _evals(root / "nofail")[-1][2]
    stop = ("--stop-at-loss", repr(target), "--max-wall-iterations", "40", "--no-final-checkpoint")
    for setting in ("checkpoint", "redundant", "checkfree"):
        extra = (*RATE_ARGS, *stop, "--set", "checkpoint_every=3", "--set", "redundant_measure_every=0")
        rc, _, _ = run_cli(simulate_argv(root / setting, *extra, setting=setting, iterations=40), cap)
        assert rc == 0, setting
        out[setting] = root / setting
    out["target"] = target
    out["root"] = root
    # the authors' rule, 2 paper iterations per iteration: boundaries and lost iterations both occur
    authors = root.parent / "authors" / "checkpoint"
    stop = ("--stop-at-loss", repr(target), "--max-wall-iterations", "80", "--no-final-checkpoint")
    rc, _, _ = run_cli(simulate_argv(authors, *AUTHORS_ARGS, *stop, setting="checkpoint", iterations=80), cap)
    assert rc == 0
    out["authors"] = authors
    return out


def test_checkpoint_and_redundant_train_the_no_failure_curve_bit_for_bit(runs):
    nofail = {e: loss for _, e, loss in _evals(runs["nofail"])}
    for setting in ("checkpoint", "redundant"):
        evals = _evals(runs[setting])
        assert len(evals) >= 7, setting
        for _, e, loss in evals:
            assert loss == nofail[e], (setting, e)  # exact: the same floats, not approximately
    ckpt = json.loads((runs["checkpoint"] / "summary.json").read_text())
    assert ckpt["strategy_stats"]["rollbacks"] >= 2 and ckpt["iterations"] > 12  # the replay is put to work
    assert ckpt["target"]["reached"] and ckpt["ended_by"] == "target"


def test_replay_reproduces_the_real_runs_exactly(runs):
    nofail = {e: loss for _, e, loss in _evals(runs["nofail"])}
    src = StageFailureInjector(4, float(P), 3)
    target = runs["target"]
    ckpt = replay_checkpoint(nofail, src, 3, 2, target, 40, 40)
    real = [r for r in read_metrics(runs["checkpoint"] / "metrics.jsonl")]
    assert ckpt.evals == _evals(runs["checkpoint"])
    assert ckpt.recoveries == [(r["iteration"], r["stage"]) for r in real if r["kind"] == "recovery"]
    assert len(ckpt.rollbacks) == sum(r["kind"] == "rollback" for r in real)
    assert ckpt.wall_iterations == json.loads((runs["checkpoint"] / "summary.json").read_text())["iterations"]
    red = replay_redundant(nofail, src, 4, 2, target, 40)
    assert red is not None and red.evals == _evals(runs["redundant"])


def test_replay_of_the_authors_rule_reproduces_a_real_run_of_it_exactly(runs):
    nofail = {e: loss for _, e, loss in _evals(runs["nofail"])}
    src = StageFailureInjector(4, float(P_AUTHORS), 3)
    rep = replay_checkpoint(nofail, src, 3, 2, runs["target"], 80, 80, "authors", 6, 3)
    real = list(read_metrics(runs["authors"] / "metrics.jsonl"))
    assert rep.evals == _evals(runs["authors"])
    assert rep.recoveries == [(r["iteration"], r["stage"]) for r in real if r["kind"] == "recovery"]
    rollbacks = [r for r in real if r["kind"] == "rollback"]
    assert [(w, frm, to, lost) for w, frm, to, lost in rep.rollbacks] == [
        (
            r["iteration"],
            r["from_effective_iteration"],
            r["to_effective_iteration"],
            r["failed_iteration_lost"],
        )
        for r in rollbacks
    ]
    assert rep.saves == [
        r["iteration"] for r in real if r["kind"] == "checkpoint" and r["purpose"] == "strategy"
    ]
    summary = json.loads((runs["authors"] / "summary.json").read_text())
    assert rep.wall_iterations == summary["iterations"] and summary["target"]["reached"]
    assert summary["strategy_stats"]["iterations_lost"] == rep.iterations_lost
    # the fixture puts both of the rule's cases to work: a lost failed iteration and a checkpoint lost on its
    # boundary (a wall-clock multiple of 3 with no save)
    assert any(lost for *_, lost in rep.rollbacks)
    assert any(w % 3 == 0 and w not in rep.saves for w, *_ in rep.rollbacks)
    # and it is not the effective rule's run
    assert replay_checkpoint(nofail, src, 3, 2, runs["target"], 80, 80).evals != rep.evals


def test_report_replays_into_groups_without_a_real_run_and_checks_the_real_ones(runs, tmp_path):
    res = build_report(
        [runs["root"]],
        "nofail@12",
        tmp_path / "report",
        TimingOptions(iteration_seconds=10.0, recovery_seconds=1.0),
        plots=False,
        replay=True,
    )
    assert {c.real.strategy for c in res.replays.checks} == {"checkpoint", "redundant"}
    assert all(c.evals_equal and c.recoveries_equal for c in res.replays.checks)
    # the real checkpoint run follows the effective rule, the report the authors' (its default): the real run
    # is still checked against its own rule's replay, and the table holds the authors' rule's replay instead
    assert [r.strategy for r in res.replays.runs] == ["checkpoint"]
    assert res.replays.runs[0].summary["strategy_stats"]["checkpoint_rule"] == "authors"
    assert [r.name for r in res.replays.superseded] == ["checkpoint"]
    rows = [r.run for g in res.groups for r in g.rows if r.run.strategy == "checkpoint"]
    assert [r.summary.get("replayed") for r in rows] == [True]
    same = build_report(
        [runs["root"]],
        "nofail@12",
        tmp_path / "report-effective",
        TimingOptions(iteration_seconds=10.0, recovery_seconds=1.0),
        plots=False,
        replay=True,
        checkpoint_rule="effective",
    )
    assert same.replays.runs == [] and same.replays.superseded == []  # both have real runs of the rule here
    text = res.report.read_text()
    assert "## Exact baselines by replay" in text and "DIFFER" not in text
    # without the real runs, the report puts replayed ones in their place: the same crossing, the same hours but
    # for the save stalls (a replay charges the median stall per save, the real run what each save measured)
    rows = {r.run.strategy: r for g in same.groups for r in g.rows}
    stalls = sum(r.get("stall_seconds", 0.0) for r in rows["checkpoint"].run.kind("checkpoint"))
    res2 = build_report(
        [runs["nofail"], runs["checkfree"]],
        "nofail@12",
        tmp_path / "report2",
        TimingOptions(iteration_seconds=10.0, recovery_seconds=1.0),
        plots=False,
        replay=True,
        checkpoint_rule="effective",  # the real run's rule
    )
    replayed = {r.run.strategy: r for g in res2.groups for r in g.rows if r.run.summary.get("replayed")}
    assert set(replayed) == {"checkpoint", "redundant"}
    for strategy in ("checkpoint", "redundant"):
        assert replayed[strategy].crossing.iteration == rows[strategy].crossing.iteration
    assert replayed["redundant"].hours_to_target == pytest.approx(
        rows["redundant"].hours_to_target, rel=1e-12
    )
    assert replayed["checkpoint"].hours_to_target == pytest.approx(
        rows["checkpoint"].hours_to_target, abs=2 * stalls / 3600 + 1e-12
    )
    assert "(replayed)" in res2.report.read_text()


def test_a_stage_lost_with_its_predecessor_cannot_be_replayed_for_redundant():
    src = ScriptedFailures({5: [2, 3]})  # stage 3's replica died with stage 2
    assert redundant_fallback_iterations(src, 4, 10) == [5]
    assert redundant_fallback_iterations(ScriptedFailures({5: [1, 3]}), 4, 10) == []
    curve = {e: 5.0 - e / 10 for e in range(0, 21, 2)}
    assert replay_redundant(curve, src, 4, 2, 3.5, 20) is None  # the fallback comes before the target (e=15)
    assert replay_redundant(curve, src, 4, 2, 4.6, 20) is not None  # the target (e=4) comes first


def test_a_replay_needs_the_no_failure_validations():
    curve = {0: 5.0, 4: 4.0}  # no validation at 2
    with pytest.raises(ReplayError, match="effective iteration 2"):
        replay_checkpoint(curve, ScriptedFailures(), 3, 2, 3.0, 10)


def test_checkpoint_replay_rolls_back_to_the_newest_checkpoint():
    curve = {e: 10.0 - e for e in range(0, 11)}
    rep = replay_checkpoint(curve, ScriptedFailures({4: [1], 5: [2, 3]}), 3, 1, 0.5, 50)
    # w0..3 → e 4 (checkpoints at e0, e3); w4 fails at e4 → back to 3; w5 fails at e4 → back to 3
    assert rep.rollbacks == [(4, 4, 3, False), (5, 4, 3, False)]
    assert rep.recoveries == [(4, 1), (5, 2), (5, 3)]
    assert rep.iterations_lost == 2 and rep.wall_iterations == 12 and rep.reached


def test_a_real_baseline_that_has_not_ended_is_not_compared_with_its_replay(runs, tmp_path):
    root = tmp_path / "runs"
    for name in ("nofail", "checkfree", "redundant"):
        shutil.copytree(runs[name], root / name)
    (root / "redundant" / "summary.json").unlink()  # still running, or killed
    res = build_report(
        [root],
        "nofail@12",
        tmp_path / "report",
        TimingOptions(iteration_seconds=10.0, recovery_seconds=1.0),
        plots=False,
        replay=True,
    )
    assert [c.real.strategy for c in res.replays.checks] == []  # before: compared, and reported as DIFFER
    assert (
        "redundant: has not ended (still running, killed, stopped or crashed): not compared with its replay."
        in res.replays.notes
    )
    assert "DIFFER" not in res.report.read_text()


def test_authors_rule_loses_the_position_inside_the_wall_clock_interval():
    """checkpoint_simulation.py at one paper iteration per iteration (K_p = K = 3): checkpoints at wall-clock 0,
    3, 6 …; a failure at wall-clock 4 goes back to the checkpoint of 3, one at 6 (a boundary) to that of 3, and
    never below it although an earlier failure (at 4) put the position under 6 − 3."""
    curve = {e: 10.0 - e for e in range(0, 11)}
    rep = replay_checkpoint(curve, ScriptedFailures({4: [1], 6: [2]}), 3, 1, 0.5, 50, rule="authors")
    # w0..3 → e3 at w3 (saved), w4 fails at e4 → back to 3; w5 → e5; w6 fails (boundary: no save at 6) → e4 → 3
    assert rep.saves == [0, 3, 9, 12]
    assert rep.rollbacks == [
        (4, 4, 3, False),
        (6, 5, 3, False),
    ]  # the literal rule would give 5 + 1 − 3 = 3 too
    rep = replay_checkpoint(curve, ScriptedFailures({2: [1], 3: [2]}), 3, 1, 0.5, 50, rule="authors")
    # w2 fails at e2 → 0; w3 (boundary) at e1: back to the checkpoint of 0, not to 1 − 3
    assert rep.rollbacks == [(2, 2, 0, False), (3, 1, 0, False)] and rep.saves == [0, 6, 9, 12]


def test_authors_rule_at_a_granularity_places_each_failure_inside_its_span():
    from checkfree.recovery.checkpoint import authors_placement, failure_offset, paper_span

    assert (
        paper_span(0, 3, 100) == (0, 34)
        and paper_span(1, 3, 100) == (34, 33)
        and paper_span(3, 3, 100) == (100, 34)
    )
    offsets = [failure_offset(7, w, 1, 34) for w in range(3000)]
    assert offsets == [failure_offset(7, w, 1, 34) for w in range(3000)]  # a pure function
    assert set(offsets) == set(range(34)) and 0.45 < sum(2 * j >= 34 for j in offsets) / 3000 < 0.55
    boundary = [w for w in range(0, 3000, 3) if authors_placement(7, w, [1], 3, 100).boundary]
    assert boundary == [w for w in range(0, 3000, 3) if failure_offset(7, w, 1, 34) == 0]
    assert not any(authors_placement(7, w, [1], 3, 100).boundary for w in range(1, 3000, 3))
    # the latest failure of the span decides whether the failed iteration is lost
    w = next(
        w
        for w in range(1, 3000, 3)
        if 2 * failure_offset(7, w, 2, 33) >= 33 > 2 * failure_offset(7, w, 1, 33)
    )
    assert authors_placement(7, w, [1, 2], 3, 100).iteration_lost
    assert not authors_placement(7, w, [1], 3, 100).iteration_lost


def test_an_unknown_rule_or_a_paper_interval_below_k_is_refused(tmp_path, capsys):
    from checkfree.recovery.checkpoint import check_rule

    with pytest.raises(
        ValueError, match=r"'checkpoint_rule' is 'weekly'; expected one of \['effective', 'authors'\]"
    ):
        check_rule("weekly", 3, 0)
    with pytest.raises(ValueError, match="'checkpoint_paper_interval' is 2; expected 0 or at least"):
        check_rule("authors", 3, 2)
    check_rule("authors", 3, 3)  # one paper iteration per iteration: the rule literally
    with pytest.raises(ValueError, match="'checkpoint_paper_interval' is 2"):
        replay_checkpoint({0: 1.0}, ScriptedFailures(), 3, 1, None, 5, rule="authors", paper_every=2)
    rc, _, err = run_cli(
        simulate_argv(tmp_path / "run", "--dry-run", "--set", "checkpoint_rule=weekly", setting="checkpoint"),
        capsys,
    )
    assert rc == 2 and "'checkpoint_rule' is 'weekly'" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="--checkpoint-rule is 'weekly'"):
        build_report([tmp_path], "auto", tmp_path / "out", checkpoint_rule="weekly")
