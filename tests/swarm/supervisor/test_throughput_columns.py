"""Issue 39 point 5's columns of throughput.json (checkfree.swarm.supervisor.results): per iteration its aborted
attempts, microbatches re-sent (the stage-0 nodes' ITERATION_ENDs say how many) and re-routes, the routing plan; per run
the within-run useful-work fraction and the fail-slow nodes; and how ``swarm table`` and ``report`` show them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkfree.report.markdown import swarm_section
from checkfree.report.runs import SwarmRun
from checkfree.report.throughput_columns import useful_work_fraction
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.results import CrashRecord, Results
from checkfree.swarm.supervisor.summary_table import summary_table

from helpers.cli import run_cli

MEMBERS = {0: [0, 1], 1: [2, 3]}
PLAN = {
    "shares": {"0": {"0": 4, "1": 4}, "1": {"2": 6, "3": 2}},
    "bound_s": 1.5,
    "plan_s": 1.5,
    "fixed_s": 2.0,
}
SLOW = {"node": 3, "stage": 1, "factor": 2.5, "since": 3}


def _results(walls: list[float]) -> tuple[Results, list[float]]:
    """A run of ``len(walls)`` committed iterations of those wall seconds, on a fake clock; iteration 1 crashed,
    iteration 2 took a second attempt, iteration 3 had 5 microbatches re-sent over 2 re-routes and a plan."""
    res = Results(SwarmConfig(model_config="tiny_config.json"), "ours", len(walls))
    clock = [0.0]
    res.now = lambda: clock[0]  # type: ignore[method-assign]
    res.start()
    ready = {n: {"grad_norm": 0.5} for n in (0, 1, 2, 3)}
    resent = {3: (3, 2), 4: (1, 0)}  # per stage-0 node's ITERATION_END
    for it, wall in enumerate(walls):
        ends = {n: {"loss": 5.0, "tokens": 10, "resent": resent.get(it, (0, 0))[n]} for n in (0, 1)}
        if it == 2:
            res.aborted(2)
        if it == 3:
            res.rerouted(3)
            res.rerouted(3)
        clock[0] += wall
        res.iteration(it, it + 1, ends, ready, MEMBERS)
        if it == 3:
            res.planned(PLAN, [SLOW])
    res.crashes.append(
        CrashRecord(slot=3, node=3, stage=1, iteration=1, cause="scheduled SIGKILL", t_crash=0.0)
    )
    return res, walls


def test_each_row_counts_its_aborted_attempts_resent_microbatches_reroutes_and_plan(tmp_path: Path) -> None:
    res, _ = _results([1.0, 3.0, 2.0, 1.0, 1.0])
    out = res.finish(tmp_path)
    rows = out["iterations"]
    assert [r["aborted_attempts"] for r in rows] == [0, 0, 1, 0, 0]
    assert [r["attempts"] for r in rows] == [1, 1, 2, 1, 1]
    assert [r["resent_microbatches"] for r in rows] == [0, 0, 0, 5, 1]
    assert [r["rerouted"] for r in rows] == [0, 0, 0, 2, 0]
    assert [r["routing_plan"] for r in rows] == [None, None, None, PLAN, None]
    assert out["fail_slow"] == [SLOW] and out["aborted_attempts"] == 1
    saved = json.loads((tmp_path / "throughput.json").read_text())
    assert saved["iterations"][3]["routing_plan"] == PLAN


def test_the_useful_work_fraction_is_the_clean_iterations_mean_over_every_iterations_mean(
    tmp_path: Path,
) -> None:
    """Walls 1, 3, 2, 1, 1: iteration 1 crashed and iteration 2 was redone, so the clean ones are 0, 3 and 4 (a
    re-route alone does not make an iteration unclean): mean 1 over the mean 8/5 = 0.625."""
    res, _ = _results([1.0, 3.0, 2.0, 1.0, 1.0])
    assert res.finish(tmp_path)["useful_work_fraction"] == pytest.approx(1.0 / 1.6)
    assert useful_work_fraction([], [1.0, 2.0]) is None
    assert useful_work_fraction([0.0], [0.0]) is None
    assert useful_work_fraction([2.0], [2.0]) == 1.0


def test_an_open_crash_makes_its_iteration_unclean(tmp_path: Path) -> None:
    """Walls 1, 3, 2, 1, 2: clean 0, 3 and 4 (mean 4/3) over 9/5; with a crash of iteration 4 still open, 0 and 3."""
    res, _ = _results([1.0, 3.0, 2.0, 1.0, 2.0])
    assert res.finish(tmp_path)["useful_work_fraction"] == pytest.approx((4 / 3) / 1.8)
    slot = type("S", (), {"slot": 5, "occupant": 5, "stage": 2})()
    res.crashed(slot, "scheduled SIGKILL", 4)  # type: ignore[arg-type]
    assert res.finish(tmp_path)["useful_work_fraction"] == pytest.approx(1.0 / 1.8)


def test_swarm_table_and_report_show_the_columns(tmp_path: Path, capsys) -> None:
    res, _ = _results([1.0, 3.0, 2.0, 1.0, 1.0])
    run = tmp_path / "run"
    out = res.finish(run)
    table = summary_table([out])
    assert "aborted attempts | re-sent microbatches (re-routes) | useful work | fail-slow |" in table
    assert table.splitlines()[2].endswith("| 1 | 6 (2) | 0.62 | 3 (stage 1, 2.5x @ 3) |")
    assert (
        "iteration 3: stage 0: 0:4 1:4; stage 1: 2:6 3:2; bound 1.500 s, plan 1.500 s, fixed routes 2.000 s"
        in table
    )
    rc, printed, _ = run_cli(["swarm", "table", str(run)], capsys)
    assert rc == 0 and "| 1 | 6 (2) | 0.62 | 3 (stage 1, 2.5x @ 3) |" in printed
    section = "\n".join(swarm_section([SwarmRun(run, json.loads((run / "throughput.json").read_text()))]))
    assert "| aborted attempts | re-sent microbatches (re-routes) | useful work | fail-slow |" in section
    assert "| 1 | 6 (2) | 0.62 | 3 (stage 1, 2.5x @ 3) |" in section
    assert (
        "routing plan (not applied to routes yet): iteration 3: stage 0: 0:4 1:4; stage 1: 2:6 3:2" in section
    )


def test_an_older_throughput_json_without_the_columns_shows_dashes(tmp_path: Path, capsys) -> None:
    res, _ = _results([1.0, 1.0])
    out = res.finish(tmp_path / "run")
    for key in ("aborted_attempts", "useful_work_fraction", "fail_slow"):
        del out[key]
    out["iterations"] = [
        {k: v for k, v in r.items() if k not in ("resent_microbatches", "rerouted", "routing_plan")}
        for r in out["iterations"]
    ]
    assert summary_table([out]).splitlines()[2].endswith("| — | 0 (0) | — | — |")
    (tmp_path / "run" / "throughput.json").write_text(json.dumps(out))
    rc, printed, _ = run_cli(["swarm", "table", str(tmp_path / "run")], capsys)
    assert rc == 0 and "Routing plans" not in printed


def test_swarm_table_refuses_a_malformed_routing_plan(tmp_path: Path, capsys) -> None:
    res, _ = _results([1.0, 1.0, 1.0, 1.0])
    out = res.finish(tmp_path / "run")
    out["iterations"][3]["routing_plan"]["shares"]["1"]["2"] = -1
    (tmp_path / "run" / "throughput.json").write_text(json.dumps(out))
    rc, _, err = run_cli(["swarm", "table", str(tmp_path / "run")], capsys)
    assert rc == 2 and "[3].routing_plan.shares.1.2' is -1" in err
