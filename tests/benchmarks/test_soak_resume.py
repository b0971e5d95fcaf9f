"""The resume soak's plan and verdicts (benchmarks/soak_resume.py), without a swarm: its kills take every kind in
turn and a mid-recovery kill lands on a crash; a resume that replaced a live node, an iteration committed twice and
a slow resume are each a missed verdict."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from helpers import ROOT


def _soak():
    spec = importlib.util.spec_from_file_location("soak_resume", ROOT / "benchmarks" / "soak_resume.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kills_take_every_kind_in_turn_and_a_mid_recovery_kill_lands_on_a_crash() -> None:
    soak = _soak()
    kills = soak.plan_kills(200, 10, crashes=[57, 140], seed=1)
    assert len(kills) == 10 and [k["iteration"] for k in kills] == sorted(k["iteration"] for k in kills)
    assert {k["kind"] for k in kills} == set(soak.KINDS)
    assert sorted(k["iteration"] for k in kills if k["kind"] == "recovering") == [57, 140]
    assert all(3 <= k["iteration"] <= 197 for k in kills)
    no_crash = soak.plan_kills(200, 10, crashes=[], seed=1)
    assert "recovering" not in {k["kind"] for k in no_crash}  # nothing to recover from: an external kill


def _run(tmp_path: Path, outages: list[dict], curve: list[int]) -> tuple[Path, list[dict], list[dict]]:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"iteration": i, "wall_s": 1.0} for i in curve]
    tp = {
        "status": "completed",
        "coordinator_outages": outages,
        "started_at": 1000.0,
        "iterations": rows,
        "loss_curve": [[i, 5.0] for i in curve],
        "crashes": [],
        "open_crashes": [],
        "crashes_count": 0,
        "recovered_count": 0,
        "iterations_completed": len(set(curve)),
        "iterations_executed": len(curve),
        "aborted_attempts": 0,
    }
    (run / "throughput.json").write_text(json.dumps(tp))
    (run / "supervisor.log").write_text("")
    kills = [{"kind": "external", "iteration": o["from_iteration"], "t_kill": 1000.0} for o in outages]
    incarnations = [{"code": -9, "samples": [], "t_start": 0, "t_end": 0} for _ in range(len(outages) + 1)]
    return tmp_path, kills, incarnations


def _outage(n: int, replaced: dict, t_next: float = 5.0) -> dict:
    return {"resume": n, "from_iteration": n, "iterations_redone": [], "rolled_forward": None,
            "adopted": [0, 1], "replaced": replaced, "t_next_commit": t_next}  # fmt: skip


def _verdicts(lines: list[str]) -> dict[str, bool]:
    return {
        line.split(" (")[0].split(" <=")[0]: line.endswith(": met")
        for line in lines
        if line.endswith(("met", "missed"))
    }


def test_replacing_a_live_node_committing_twice_and_a_slow_resume_are_missed(tmp_path: Path) -> None:
    soak = _soak()
    args = argparse.Namespace(
        iterations=4, fd_slack=16, rss_growth=0.25, stall_slack_s=10.0, resume_slack_s=30.0
    )
    good = [_outage(1, {"7": "its process is gone"})]
    (tmp_path / "a").mkdir()
    out, kills, incs = _run(tmp_path / "a", good, [0, 1, 2, 3])
    v = _verdicts(soak.report(out, kills, incs, args))
    assert v["every resume re-adopted the live nodes"] and v["nothing committed lost"]
    assert v["resume latency max 5.0 s"]
    (tmp_path / "b").mkdir()
    bad = [_outage(1, {"3": "claims weights version 9; the journal gives 8"}, t_next=40.0)]
    out, kills, incs = _run(tmp_path / "b", bad, [0, 1, 1, 2, 3])
    v = _verdicts(soak.report(out, kills, incs, args))
    assert not v["every resume re-adopted the live nodes"]  # a live node replaced: not re-adopted
    assert not v["nothing committed lost"]  # iteration 1 twice
    assert not v["resume latency max 40.0 s"]  # 40 s > 30 s + 2 x 1 s
