"""The report's "Trace replays" section: simulator and swarm runs that replayed a preemption trace's downtime
schedule, with the numbers read from their files (checkfree/report/traces.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checkfree.failures.traces import DOWNTIME_FORMAT
from checkfree.report.analysis import TimingOptions
from checkfree.report.build import REPORT_MARKER, build_report

from helpers.report import comparison, make_run

pytestmark = pytest.mark.timeout(120)

TRACE = "bamboo-p3-trace.csv"


def write_schedule(path: Path, trace: str | None = TRACE) -> Path:
    """A small ``checkfree-slot-downtime-v1`` schedule (4 stages × 2 replicas) as failure_generator.py writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = {"trace_format": "bamboo", "sha256": "0" * 64, "rule": "emptiest stage first, spares FIFO"}
    if trace is not None:
        source["trace"] = trace
    path.write_text(
        json.dumps(
            {
                "format": DOWNTIME_FORMAT,
                "stages": 4,
                "replicas": 2,
                "iterations": 40,
                "iteration_seconds": 120.0,
                "source": source,
                "slots": {"4": [[5, 8]], "5": [[5, 6]], "6": [[12, 20]]},
            }
        )
    )
    return path


def trace_run(
    root: Path, name: str, strategy: str, schedule: str, short: dict | None, lost: dict | None, **kw
):
    """A simulator run launched with ``--failure-schedule schedule``; its summary holds the replica shortage the
    simulator writes (checkfree.sim.launch.replica_shortage), or nothing when ``short`` and ``lost`` are None."""
    d = make_run(root, name, strategy, [(0, 8.0), (20, 6.0), (40, 5.25)], failures=(5, 12), **kw)
    options = json.loads((d / "options.json").read_text())
    options["failure_schedule"] = schedule
    (d / "options.json").write_text(json.dumps(options))
    if (d / "summary.json").is_file() and (short is not None or lost is not None):
        summary = json.loads((d / "summary.json").read_text())
        summary |= {"short_of_replicas_iterations": short, "all_replicas_down_iterations": lost}
        (d / "summary.json").write_text(json.dumps(summary))
    return d


SHORT = {"1": 3, "2": 8, "3": 0, "4": 1}  # 12 iterations short of replicas in all
LOST = {"1": 0, "2": 2, "3": 0, "4": 1}  # 3 iterations with a stage lost


def swarm_dir(root: Path, name: str, data: dict) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "throughput.json").write_text(json.dumps(data))
    return d


def swarm_trace(**over) -> dict:
    """throughput.json of a swarm run that replayed a downtime schedule (checkfree.swarm.supervisor.results)."""
    data = {
        "setting": "ours-plus",
        "iterations_completed": 30,
        "mean_iteration_s": 2.0,
        "tokens_per_s": 512.5,
        "crashes_count": 3,
        "recovered_count": 3,
        "mean_crash_to_serving_s": 7.5,
        "mean_recovery_s": 2.25,
        "crashes": [
            {"node": 4, "stage": 2, "iteration": 5, "latency_s": 6.0, "recovery_s": 2.0, "down_until": 8},
            {"node": 5, "stage": 2, "iteration": 5, "latency_s": 9.0, "recovery_s": 2.5, "down_until": 6},
            {"node": 6, "stage": 3, "iteration": 12, "latency_s": 7.5, "recovery_s": 2.25, "down_until": 20},
        ],
        "bytes_sent_by_type": {"ACTIVATION": 1000},
        "schedule": {
            "path": "runs/p3/schedule.json",
            "format": DOWNTIME_FORMAT,
            "iterations": 40,
            "iteration_seconds": 120.0,
            "source": {"trace": TRACE, "trace_format": "bamboo", "sha256": "0" * 64},
        },
        "replica_shortage": {
            "0": {
                "short_iterations": 0,
                "short_s": 0.0,
                "waiting_iterations": 0,
                "waiting_s": 0.0,
                "losses": 0,
            },
            "1": {
                "short_iterations": 0,
                "short_s": 0.0,
                "waiting_iterations": 0,
                "waiting_s": 0.0,
                "losses": 0,
            },
            "2": {
                "short_iterations": 2,
                "short_s": 4.5,
                "waiting_iterations": 1,
                "waiting_s": 2.0,
                "losses": 1,
            },
            "3": {
                "short_iterations": 8,
                "short_s": 16.0,
                "waiting_iterations": 0,
                "waiting_s": 0.0,
                "losses": 0,
            },
            "4": {
                "short_iterations": 1,
                "short_s": 1.5,
                "waiting_iterations": 3,
                "waiting_s": 6.0,
                "losses": 1,
            },
        },
        "waits": [
            {"iteration": 6, "from": 5, "to": 6, "stages": [2], "seconds": 2.0},
            {"iteration": 14, "from": 13, "to": 16, "stages": [4], "seconds": 6.0},
        ],
    }
    return data | over


def report(tmp_path: Path, dirs: list[Path], name: str = "out"):
    res = build_report(dirs, 5.0, tmp_path / name, TimingOptions(iteration_seconds=100.0), plots=False)
    return res, res.report.read_text(), json.loads((tmp_path / name / REPORT_MARKER).read_text())


def section_of(text: str) -> str:
    start = text.index("## Trace replays")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else None]


def test_simulator_trace_runs_get_one_row_each(tmp_path):
    root = tmp_path / "runs"
    schedule = str(write_schedule(tmp_path / "p3" / "schedule.json"))
    trace_run(root, "cf", "checkfree", schedule, SHORT, LOST)
    trace_run(root, "ckpt", "checkpoint", schedule, SHORT, LOST)
    make_run(root, "plain", "checkfree_plus", [(0, 8.0), (40, 5.0)], swaps=True, failures=(5,))
    res, text, marker = report(tmp_path, [root])
    rows = {r.run: r for r in res.traces.simulator}
    assert set(rows) == {"cf", "ckpt"}  # the Bernoulli run is not a trace replay
    cf = rows["cf"]
    assert (cf.setting, cf.schedule, cf.stage_losses) == ("checkfree", TRACE, 2)
    assert (cf.short_of_replicas_iterations, cf.all_replicas_down_iterations) == (12, 3)
    assert cf.final_val_loss == pytest.approx(5.25) and cf.perplexity == pytest.approx(2.718**5.25)
    sec = section_of(text)
    assert f"| checkfree <br>`cf` | `{TRACE}` | 2 | 12 | 3 | 5.2500 | {2.718**5.25:.2f} |" in sec
    assert "iterations short of replicas" in sec and "*stage losses*:" in sec  # columns explained
    assert "Swarm runs:" not in sec
    (row,) = [r for r in marker["trace_replays"]["simulator"] if r["run"] == "ckpt"]
    assert row["schedule"] == TRACE and row["short_of_replicas_iterations"] == 12
    assert row["all_replicas_down_iterations"] == 3 and row["stage_losses"] == 2
    assert marker["trace_replays"]["swarm"] == []


def test_schedule_found_from_the_launch_directory_else_named_by_its_file(tmp_path, monkeypatch):
    launch = tmp_path / "launch"
    write_schedule(launch / "runs" / "p3" / "schedule.json", trace="parcae-trace.txt")
    # launched from `launch` with relative paths; the report runs from elsewhere
    found = trace_run(
        launch / "runs" / "p3" / "runs", "found", "ladder", "runs/p3/schedule.json", SHORT, LOST
    )
    options = json.loads((found / "options.json").read_text())
    (found / "options.json").write_text(json.dumps(options | {"run_dir": "runs/p3/runs/found"}))
    gone = trace_run(tmp_path / "other", "gone", "checkfree", "elsewhere/S.json", {"1": 1}, {"1": 0})
    # a partial run (no summary.json): losses from metrics.jsonl, shortage unknown
    partial = trace_run(
        launch / "runs" / "p3" / "runs", "partial", "checkfree", "", None, None, summary=False
    )
    options = json.loads((partial / "options.json").read_text())
    (partial / "options.json").write_text(
        json.dumps(options | {"run_dir": "runs/p3/runs/partial", "failure_schedule": "runs/p3/schedule.json"})
    )
    monkeypatch.chdir(tmp_path / "other")
    res, text, _ = report(tmp_path, [found, gone, partial])
    rows = {r.run: r for r in res.traces.simulator}
    assert rows["found"].schedule == "parcae-trace.txt"
    assert Path(rows["found"].schedule_path).resolve() == (launch / "runs" / "p3" / "schedule.json").resolve()
    assert rows["gone"].schedule == "S.json" and rows["gone"].short_of_replicas_iterations == 1
    p = rows["partial"]
    assert p.partial and p.schedule == "parcae-trace.txt" and p.stage_losses == 2
    assert p.short_of_replicas_iterations is None and p.all_replicas_down_iterations is None
    assert "| checkfree [partial] <br>`partial` | `parcae-trace.txt` | 2 | — | — | 5.2500 |" in section_of(
        text
    )


def test_swarm_trace_runs_get_one_row_each(tmp_path):
    root = tmp_path / "runs"
    swarm_dir(root, "sw_trace", swarm_trace())
    # older keys only: means from the crashes, an unrecovered slot under open_crashes, schedule named by its file
    lean = swarm_trace(
        schedule={"path": "/x/S.json", "format": DOWNTIME_FORMAT, "source": {}},
        mean_crash_to_serving_s=None,
        mean_recovery_s=None,
        crashes_count=2,
        recovered_count=2,
        open_crashes=[  # one slot the trace keeps down to the end, one replacement that never served
            {"node": 7, "stage": 3, "iteration": 28, "down_until": None},
            {"node": 8, "stage": 4, "iteration": 29},
        ],
        waits="garbled",
    )
    lean["crashes"] = lean["crashes"][:2]
    swarm_dir(root, "sw_lean", lean)
    swarm_dir(root, "sw_nodes", swarm_trace(schedule={"path": "n.json", "format": "node-crash-iterations"}))
    swarm_dir(root, "sw_plain", {k: v for k, v in swarm_trace().items() if k not in ("schedule",)})
    res, text, marker = report(tmp_path, [root])
    rows = {r.run: r for r in res.traces.swarm}
    assert set(rows) == {"sw_trace", "sw_lean"}  # a node-crash schedule or none is not a trace replay
    t = rows["sw_trace"]
    assert (t.setting, t.schedule, t.iterations_completed, t.stage_losses) == ("ours-plus", TRACE, 30, 2)
    assert t.short_of_replicas_s == pytest.approx(22.0) and t.waiting_s == pytest.approx(8.0) and t.waits == 2
    assert (t.mean_crash_to_serving_s, t.mean_recovery_s) == (7.5, 2.25)
    assert (t.crashes, t.recovered, t.every_loss_recovered, t.tokens_per_s) == (3, 3, True, 512.5)
    lean_row = rows["sw_lean"]
    assert lean_row.schedule == "S.json" and lean_row.waits is None
    assert lean_row.mean_crash_to_serving_s == pytest.approx(7.5)  # (6 + 9) / 2
    assert lean_row.mean_recovery_s == pytest.approx(2.25)  # (2 + 2.5) / 2
    assert (lean_row.crashes, lean_row.recovered, lean_row.held_down) == (4, 2, 1)
    # the replacement that never served is a loss not recovered; the slot the trace kept down is not
    assert lean_row.every_loss_recovered is False
    sec = section_of(text)
    assert "Simulator runs:" not in sec and "*waiting s*:" in sec
    assert (
        f"| ours-plus <br>`sw_trace` | `{TRACE}` | 30 | 2 | 22.0 | 8.0 (2 waits) | 7.50 | 2.25 | yes (3 of 3) |"
        in sec
    )
    assert (
        "| ours-plus <br>`sw_lean` | `S.json` | 30 | 2 | 22.0 | 8.0 | 7.50 | 2.25 | no (2 of 4; 1 kept down by the trace to its end) | 512.5 |"
        in sec
    )
    (row,) = [r for r in marker["trace_replays"]["swarm"] if r["run"] == "sw_trace"]
    assert row["short_of_replicas_s"] == 22.0 and row["every_loss_recovered"] is True


def test_a_report_without_trace_runs_has_no_such_section(tmp_path):
    root = tmp_path / "runs"
    dirs = comparison(root)
    stage_file = tmp_path / "stage_failures.json"  # a schedule of stage failures is not a trace replay
    stage_file.write_text(json.dumps({"format": "checkfree-stage-failures-v1", "failures": []}))
    dirs.append(trace_run(root, "scheduled", "checkfree", str(stage_file), None, None))
    dirs.append(swarm_dir(root, "sw", swarm_trace(schedule={"path": None, "format": None})))
    res, text, marker = report(tmp_path, dirs)
    assert not res.traces and "Trace replays" not in text
    assert marker["trace_replays"] == {"simulator": [], "swarm": []}
