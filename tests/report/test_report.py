"""The report on synthetic run directories: rows, time to target, speed-ups, verdicts, malformed input."""

from __future__ import annotations

import json

import pytest

from checkfree.report.analysis import TimingOptions
from checkfree.report.build import build_report
from checkfree.report.runs import load_run

from helpers.report import comparison, make_run

pytestmark = pytest.mark.timeout(60)


def _row(res, name):
    return next(r for g in res.groups for r in g.rows if r.run.name == name)


def test_report_rows_time_to_target_and_speedups(tmp_path):
    dirs = comparison(tmp_path / "runs")
    res = build_report(
        dirs,
        5.0,
        tmp_path / "out",
        TimingOptions(iteration_seconds=100.0, recovery_seconds=30.0),
        plots=False,
    )
    assert len(res.groups) == 1 and len(res.groups[0].rows) == 5
    cf, cfp, ckpt, red = (_row(res, n) for n in ("cf", "cfp", "ckpt", "red"))
    # checkfree crosses between 20 (5.5) and 30 (4.5): 25; 25 iterations · 100 s + 2 recoveries · 30 s
    assert cf.crossing.iteration == pytest.approx(25.0) and cf.crossing.interpolated
    assert cf.hours_to_target == pytest.approx((2500 + 60) / 3600)
    assert cfp.crossing.iteration == 20 and cfp.hours_to_target == pytest.approx((2000 + 60) / 3600)
    assert ckpt.hours_to_target == pytest.approx((4000 + 60) / 3600)
    assert cf.speedup_vs_checkpoint == pytest.approx(4060 / 2560)
    assert ckpt.speedup_vs_checkpoint == pytest.approx(1.0)
    assert red.hours_to_target is None and red.speedup_vs_checkpoint is None
    text = res.report.read_text()
    assert "not reached (best 5.2000 at it. 30)" in text  # never reached says so, not 0
    assert "1.59×" in text  # 4060 / 2560
    assert "given: 100 s" in text
    assert "10 (2 rollbacks)" in text


def test_report_verdicts_follow_the_numbers(tmp_path):
    res = build_report(
        comparison(tmp_path / "runs"),
        5.0,
        tmp_path / "out",
        TimingOptions(iteration_seconds=100.0, recovery_seconds=30.0),
        plots=False,
    )
    t2 = {v.statement: v for v in res.verdicts if v.claim.startswith("Table 2")}
    # at 16 %/h: the combined ordering, then each pairwise one (checkfree_plus 2060 s, checkpoint 4060 s)
    assert list(t2) == [
        "Table 2: redundant computation has the shortest time to target",
        "Table 2: hours to target redundant computation < CheckFree+",
        "Table 2: hours to target redundant computation < checkpointing",
        "Table 2: hours to target CheckFree+ < checkpointing",
        "Table 2: hours to target CheckFree < checkpointing",
        "Table 2: hours to target CheckFree+ < CheckFree",
    ]
    shortest = t2["Table 2: redundant computation has the shortest time to target"]
    assert (
        shortest.holds is False
    )  # redundant never reached the target: the paper's 16 %/h ordering fails here
    assert "redundant never reached" in shortest.evidence
    assert not any(v.holds for s, v in t2.items() if "redundant" in s)
    # CheckFree+ 2060 s < CheckFree 2560 s < checkpointing 4060 s: the rest of the paper's 16 %/h order holds
    assert all(v.holds for s, v in t2.items() if "redundant" not in s)
    fig2 = [v for v in res.verdicts if v.claim.startswith("Fig. 2")]
    assert fig2 and fig2[0].holds is None  # random, copy and average were not run
    text = res.report.read_text()
    assert "**does not hold**" in text and "**not judged**" in text


def test_report_plots_are_pngs_that_open(tmp_path):
    import matplotlib.image as mpimg

    res = build_report(
        comparison(tmp_path / "runs"), 5.0, tmp_path / "out", TimingOptions(iteration_seconds=10.0)
    )
    names = {p.name for p in res.plots}
    assert {"val_loss_vs_iterations.png", "val_loss_vs_hours.png"} <= names
    assert any(n.startswith("train_loss_") for n in names)
    for p in res.plots:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(p).shape[0] > 100
        assert f"]({p.name})" in res.report.read_text()


def test_partial_and_malformed_directories_are_reported_not_fatal(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "good", "checkfree", [(0, 8.0), (10, 6.0), (20, 4.0)])
    make_run(
        root, "partial", "checkfree_plus", [(0, 8.0), (10, 5.5)], swaps=True, summary=False, iterations=12
    )
    (root / "empty").mkdir()
    bad = make_run(root, "badjson", "copy", [(0, 8.0), (10, 6.0)])
    lines = (bad / "metrics.jsonl").read_text().splitlines()
    lines.insert(1, "{not json")
    (bad / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    badsum = make_run(root, "badsummary", "copy", [(0, 8.0), (10, 6.0)])
    (badsum / "summary.json").write_text("{")
    noeval = make_run(root, "noeval", "copy", [(0, 8.0)])
    (noeval / "metrics.jsonl").write_text('{"kind": "train", "iteration": 0, "loss": 1.0}\n{"kind": "tr')
    (root / "file.txt").write_text("x")
    res = build_report(
        [root, root / "file.txt"], 5.0, tmp_path / "out", TimingOptions(iteration_seconds=10.0), plots=False
    )
    assert sorted(r.name for r in res.runs) == ["good", "partial"]
    skipped = {p.name: why for p, why in res.skipped}
    assert set(skipped) == {"empty", "badjson", "badsummary", "noeval", "file.txt"}
    assert "line 2 is not valid JSON" in skipped["badjson"]
    assert "no evaluation" in skipped["noeval"]
    partial = _row(res, "partial")
    assert partial.run.partial and partial.run.iterations == 12
    text = res.report.read_text()
    assert "checkfree_plus [partial]" in text and "## Skipped run directories" in text
    assert "badsummary/summary.json is not valid JSON" in text
    assert "file.txt` is not a directory" in text or "file.txt is not a directory" in text


def test_nothing_usable_is_one_clear_error(tmp_path, capsys):
    from checkfree.cli import main

    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no usable run directory"):
        build_report([tmp_path / "empty"], 5.0, tmp_path / "out", plots=False)
    rc = main(["report", str(tmp_path / "empty"), "--target-loss", "5", "--out", str(tmp_path / "out")])
    assert rc == 2
    assert "no usable run directory" in capsys.readouterr().err


def test_resume_supersedes_the_killed_segment(tmp_path):
    d = make_run(tmp_path, "r", "checkfree", [(0, 8.0), (10, 6.0), (20, 5.0)])
    with open(d / "metrics.jsonl", "a") as f:  # killed after 20, resumed from the checkpoint at 10
        f.write(json.dumps({"kind": "resume", "iteration": 10, "effective_iteration": 10}) + "\n")
        f.write(json.dumps({"kind": "eval", "iteration": 10, "val_loss": 6.0}) + "\n")
        f.write(json.dumps({"kind": "eval", "iteration": 20, "val_loss": 5.8}) + "\n")
    run = load_run(d)
    assert sorted(run.evals) == [(0, 8.0), (10, 6.0), (20, 5.8)]


def test_duplicate_writers_are_flagged(tmp_path):
    d = make_run(tmp_path, "dup", "checkfree", [(0, 8.0), (10, 6.0)])
    text = (d / "metrics.jsonl").read_text()
    (d / "metrics.jsonl").write_text(text + text)
    run = load_run(d)
    assert any("two processes" in w for w in run.warnings)
    assert len(run.kind("train")) == 10


def test_auto_target_and_swarm_timing(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "nf", "no_failure", [(0, 8.0), (10, 6.0), (20, 5.0), (30, 4.0), (40, 3.5)])
    make_run(root, "cf", "checkfree", [(0, 8.0), (10, 6.5), (20, 5.5), (30, 4.5), (40, 4.0)])
    sw = root / "swarm"
    sw.mkdir()
    (sw / "throughput.json").write_text(
        json.dumps(
            {  # checkfree.swarm.supervisor.results' layout, tokens/s left out
                "setting": "ours",
                "iterations_completed": 3,
                "mean_iteration_s": 14.0,
                "iterations": [
                    {"iteration": 0, "wall_s": 10.0},
                    {"iteration": 1, "wall_s": 12.0},
                    {"iteration": 2, "wall_s": 20.0},
                ],
                "crashes": [
                    {
                        "node": 4,
                        "stage": 1,
                        "iteration": 2,
                        "rule": "checkfree",
                        "sources": [3, 5],
                        "latency_s": 6.0,
                        "bytes": 100,
                    }
                ],
            }
        )
    )
    res = build_report([root], "auto", tmp_path / "out", plots=False)
    assert res.target == 4.0  # the no-failure loss at 75 % of its 40 iterations (iteration 30)
    m = res.groups[0].rows[0].timeline
    assert m.iteration_seconds == pytest.approx(
        12.0
    )  # the swarm's median iteration time (crash spike left out)
    text = res.report.read_text()
    assert "swarm measured: 12 s" in text and "swarm measured: 6 s per stage" in text
    assert "Swarm runs averaged for T_iter (steady iterations, crashes left out): swarm (12 s)" in text
    assert "## Swarm runs" in text and "node 4 (stage 1, iteration 2) → checkfree from [3, 5], 6.00 s" in text
    assert "throughput.json lacks tokens/s, bytes by message type" in text


def test_fig4c_and_fig2_verdicts(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "nf", "no_failure", [(0, 8.0), (40, 4.0)])
    make_run(root, "nfs", "no_failure", [(0, 8.0), (40, 4.1)], swaps=True)
    make_run(root, "rnd", "random", [(0, 8.0), (40, 7.0)])
    make_run(root, "copy", "copy", [(0, 8.0), (40, 4.6)])
    make_run(root, "avg", "average", [(0, 8.0), (40, 4.4)])
    make_run(root, "cf", "checkfree", [(0, 8.0), (40, 4.3)])
    res = build_report([root], 5.0, tmp_path / "out", TimingOptions(iteration_seconds=10.0), plots=False)
    by = {v.claim.split(" (")[0]: v for v in res.verdicts}
    assert by["Fig. 4c"].holds is True and "+0.1000" in by["Fig. 4c"].evidence
    assert by["Fig. 2"].holds is True
    (root / "avg" / "summary.json").unlink()  # partial: rate from options.json, p from config["16"]
    res = build_report(
        [root / n for n in ("rnd", "copy", "avg", "cf")],
        5.0,
        tmp_path / "out2",
        TimingOptions(iteration_seconds=10.0),
        plots=False,
    )
    assert len(res.groups) == 1 and [v.holds for v in res.verdicts if v.claim.startswith("Fig. 2")] == [True]


def test_every_recovery_rule_gets_its_own_colour_in_the_recoveries_plot():
    from matplotlib.colors import to_rgb

    from checkfree.recovery.planner import PLAN_RULES
    from checkfree.report.colours import colours as palette

    rules = sorted(PLAN_RULES | {"rollback", "restore_one", "initial", "a_new_rule"})
    colours = palette(rules)
    assert set(colours) == set(rules)
    assert len({to_rgb(c) for c in colours.values()}) == len(rules)
    # a strategy keeps its colour in every plot; a second label of the same strategy gets its own
    probe = palette(["no_failure", "no_failure +swaps", "checkfree"])
    assert probe["no_failure"] == "black" and probe["checkfree"] == "tab:green"
    assert len(set(probe.values())) == 3
