"""Real preemption traces → slot down intervals → stage losses (checkfree.failures.traces)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkfree.failures.schedules import load_stage_schedule
from checkfree.failures.traces import (
    DOWNTIME_FORMAT,
    DowntimeSchedule,
    load_downtime,
    map_trace,
    parse_downtime,
    read_trace,
    save_downtime,
    schedule_from_trace,
)

from helpers import ROOT

P3 = ROOT / "failure_traces" / "bamboo-p3-trace.csv"
PARCAE = ROOT / "failure_traces" / "parcae-gpt-1.5b-trace_hh_55_65.txt"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_nodes_fill_the_emptiest_stage_first_and_spares_wait_in_order(tmp_path: Path) -> None:
    # 2 stages × 2 replicas (slots = node ids 2, 3 for stage 1 and 4, 5 for stage 2), 10 s per iteration.
    trace = write(
        tmp_path,
        "0,add,a\n0,add,b\n0,add,c\n0,add,d\n0,add,e\n"  # a→2, b→4 (stage 2 emptier), c→3, d→5, e spare
        "25000,remove,a\n"  # it 2: slot 2 down, spare e fills it at once: [2, 2]
        "41000,remove,b\n"  # it 4: slot 4 down, no spare
        "63000,remove,c\n"  # it 6: slot 3 down
        "75000,add,f\n",  # it 7: both stages have 1 live replica; the lower one gets f: slot 3 is back
    )
    events, fmt = read_trace(trace)
    assert fmt == "bamboo" and len(events) == 9
    sched = map_trace(events, stages=2, replicas=2, iteration_seconds=10.0, hours=0.025)  # 9 iterations
    assert sched.iterations == 9
    assert sched.slots == {2: [(2, 2)], 3: [(6, 7)], 4: [(4, None)]}
    assert sched.short_iterations(1) == [2, 6]
    assert sched.short_iterations(2) == [4, 5, 6, 7, 8]
    assert sched.lost_iterations(1) == [] and sched.lost_iterations(2) == []


def test_the_spare_that_waited_longest_fills_an_emptied_slot(tmp_path: Path) -> None:
    """Spares are a queue (first in, first out), as the mapping rule says and records: e waited before f, so e
    fills the slot a leaves, and when e leaves in turn the slot goes down again and f fills it. Taken last in,
    first out, f would fill it and e's leaving would change nothing."""
    trace = write(
        tmp_path,
        "0,add,a\n0,add,b\n0,add,c\n0,add,d\n0,add,e\n0,add,f\n"  # a→2, b→4, c→3, d→5; e, then f wait
        "25000,remove,a\n"  # it 2: slot 2 down, e (the older spare) fills it at once: [2, 2]
        "45000,remove,e\n",  # it 4: e leaves slot 2, f fills it at once: [4, 4]
    )
    sched = map_trace(read_trace(trace)[0], stages=2, replicas=2, iteration_seconds=10.0, hours=0.025)
    assert sched.slots == {2: [(2, 2), (4, 4)]}
    assert sched.source["rule"] == "emptiest stage first, spares FIFO"


def test_a_stage_is_lost_only_when_its_last_replica_goes(tmp_path: Path) -> None:
    trace = write(tmp_path, "0,add,a\n0,add,b\n30000,remove,a\n52000,remove,b\n80000,add,c\n99000,add,d\n")
    sched = schedule_from_trace(trace, stages=1, replicas=2, iteration_seconds=10.0, hours=0.03)
    assert sched.slots == {2: [(3, 8)], 3: [(5, 9)]}
    assert sched.short_iterations(1) == [3, 4, 8]
    assert sched.lost_iterations(1) == [5, 6, 7]
    assert sched.stage_losses() == [(5, 1)]  # the iteration the last replica went down
    assert "lost 1 times (5–7)" in sched.describe()


def test_an_instant_replacement_counts_as_down_for_its_iteration(tmp_path: Path) -> None:
    # both replicas crash in iteration 1 and are replaced by spares at once: the stage's state is gone
    trace = write(tmp_path, "0,add,a\n0,add,b\n0,add,s1\n0,add,s2\n10500,remove,a\n10600,remove,b\n")
    sched = schedule_from_trace(trace, stages=1, replicas=2, iteration_seconds=10.0, hours=0.01)
    assert sched.slots == {2: [(1, 1)], 3: [(1, 1)]}
    assert sched.stage_losses() == [(1, 1)]


def test_parcae_lines_are_detected_and_read(tmp_path: Path) -> None:
    lines = [
        [0, "add", {"nodes": ["n0", "n1"], "duration": 60000}],
        [60000, "no-op", {"nodes": [], "duration": 60000}],
        [120000, "remove", {"nodes": ["n1"], "duration": 60000}],
    ]
    trace = write(tmp_path, "\n".join(json.dumps(x) for x in lines) + "\n", "trace.txt")
    events, fmt = read_trace(trace)
    assert fmt == "parcae"
    assert [(e.ms, e.kind, e.node) for e in events] == [
        (0, "add", "n0"),
        (0, "add", "n1"),
        (120000, "remove", "n1"),
    ]
    sched = map_trace(events, stages=1, replicas=2, iteration_seconds=60.0, hours=0.05)
    assert sched.slots == {3: [(2, None)]} and sched.stage_losses() == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "holds no add or remove event"),
        ("0,add,a\n10,remove,b\n", "line 2: removes 'b', which is not in the pool"),
        ("0,add,a\n10,remove,a\n20,remove,a\n", "line 3: removes 'a', which is not in the pool"),
        ("0,add,a\n0,add,a\n", "line 2: adds 'a', which is already in the pool"),
        ("100,add,a\n50,add,b\n", "line 2: time 50 ms is before the previous event's 100 ms"),
        ("0,add,a\nsoon,add,b\n", "line 2: 'soon,add,b' is not 'milliseconds,add|remove,node'"),
        ("0,join,a\n", "is not 'milliseconds,add|remove,node'"),
        ("hello\n", "neither a Bamboo event"),
    ],
)
def test_a_bad_trace_is_refused_with_one_sentence(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_trace(write(tmp_path, text))


def test_map_trace_refuses_bad_parameters(tmp_path: Path) -> None:
    events, _ = read_trace(write(tmp_path, "0,add,a\n1000,remove,a\n"))
    for kwargs, message in (
        ({"stages": 0}, "stages is 0"),
        ({"replicas": 1.5}, "replicas is 1.5"),
        ({"iteration_seconds": 0}, "iteration_seconds is 0"),
        ({"iteration_seconds": 1e-9, "hours": 1000}, "expected 1..1000000"),
        ({"hours": -1}, "hours is -1"),
    ):
        args = {"stages": 2, "replicas": 2, "iteration_seconds": 1.0, "hours": 1.0} | kwargs
        with pytest.raises(ValueError, match=message):
            map_trace(events, **args)


def test_events_before_the_window_set_the_pool_and_later_ones_are_cut(tmp_path: Path) -> None:
    trace = write(
        tmp_path, "0,add,a\n0,add,b\n1000,remove,a\n2000,add,c\n3600000,remove,b\n7300000,remove,c\n"
    )
    sched = schedule_from_trace(trace, 1, 2, iteration_seconds=60.0, start_hours=0.5, hours=1.0)
    assert sched.iterations == 60
    assert sched.slots == {
        3: [(30, None)]
    }  # b leaves 1 h in = 30 min into the window; c's removal is past it


def test_the_schedule_round_trips_through_its_file_and_bad_files_are_refused(tmp_path: Path) -> None:
    sched = schedule_from_trace(P3, stages=12, replicas=2, iteration_seconds=91.32)
    out = tmp_path / "p3.json"
    save_downtime(out, sched)
    again = load_downtime(out)
    assert again.slots == sched.slots and again.stage_losses() == sched.stage_losses()
    data = json.loads(out.read_text())
    assert data["format"] == DOWNTIME_FORMAT and data["source"]["trace_format"] == "bamboo"
    for patch, message in (
        ({"format": "v0"}, "is not a 'checkfree-slot-downtime-v1' schedule"),
        ({"replicas": 0}, "'replicas' is 0"),
        ({"slots": {"1": [[0, 1]]}}, "slot '1' is not a transformer-stage node id; expected 2..25"),
        ({"slots": {"5": [[3, 2]]}}, r"slot 5: \[3, 2\] is not a \[down, up\] pair"),
        ({"slots": {"5": [[1, 4], [4, 6]]}}, r"slot 5: \[4, 6\] is not"),
        ({"slots": {"5": [[1, None], [8, 9]]}}, r"slot 5: \[8, 9\] is not"),
        ({"iteration_seconds": float("nan")}, "'iteration_seconds' is nan"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_downtime({**data, **patch}, "schedule 'x'")


def test_a_schedule_without_slots_is_refused_not_read_as_no_failures(tmp_path: Path) -> None:
    """No "slots" key is a broken file, not a schedule in which nothing goes down; ``"slots": {}`` is one."""
    head = {"format": DOWNTIME_FORMAT, "stages": 2, "replicas": 2, "iterations": 10, "iteration_seconds": 10}
    assert parse_downtime({**head, "slots": {}}, "schedule 'x'").slots == {}
    with pytest.raises(ValueError, match=r"^schedule 'x' has no 'slots'; expected an object") as err:
        parse_downtime(head, "schedule 'x'")
    assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")
    path = tmp_path / "no_slots.json"
    path.write_text(json.dumps(head))
    with pytest.raises(ValueError, match="has no 'slots'"):
        load_downtime(path)


def test_the_p3_trace_on_the_authors_12_x_2_layout_loses_stages(tmp_path: Path) -> None:
    sched = schedule_from_trace(P3, stages=12, replicas=2, iteration_seconds=91.32)
    assert sched.iterations == 449  # 11.37 h of trace at the paper's 91.32 s per iteration
    losses = sched.stage_losses()
    assert 8 <= len(losses) <= 30
    for it, stage in losses:  # the definition, checked slot by slot
        assert all(_down(sched, node, it) for node in sched.slot_ids(stage))
        assert it == 0 or not all(_down(sched, node, it - 1) for node in sched.slot_ids(stage))
    assert sum(len(sched.short_iterations(s)) for s in range(1, 13)) > 100


def _down(sched: DowntimeSchedule, node: int, k: int) -> bool:
    return any(
        d <= k < (sched.iterations if u is None else max(u, d + 1)) for d, u in sched.slots.get(node, [])
    )


def test_the_parcae_trace_shipped_maps_too() -> None:
    sched = schedule_from_trace(PARCAE, stages=12, replicas=2, iteration_seconds=91.32)
    assert sched.source["trace_format"] == "parcae" and sched.iterations == 35


def test_the_simulator_replays_losses_and_records_the_short_iterations(tmp_path: Path) -> None:
    sched = schedule_from_trace(P3, stages=12, replicas=2, iteration_seconds=91.32)
    out = tmp_path / "p3.json"
    save_downtime(out, sched)
    replay = load_stage_schedule(out, n_stages=12)
    assert replay.all() == sched.stage_losses()
    assert replay.short_iterations[3] == sched.short_iterations(3)
    assert replay.lost_iterations[10] == sched.lost_iterations(10)
    with pytest.raises(ValueError, match=r"maps 12 transformer stages; the config has 4: expected the same"):
        load_stage_schedule(out, n_stages=4)


def run_generator(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "failure_generator.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_failure_generator_maps_a_trace_and_describes_it(tmp_path: Path) -> None:
    out = tmp_path / "p3.json"
    r = run_generator("--trace", str(P3), "--stages", "12", "--replicas", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert load_downtime(out).stages == 12
    r = run_generator("--describe", str(out))
    assert r.returncode == 0 and r.stdout.count("\n") == 13 and "stage 12: short of replicas" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "missing.csv"], "trace 'missing.csv' does not exist"),
        (["--trace", "P3", "--rate", "16"], "--trace and --rate were both given"),
        (["--stages", "3"], "no --rate, --trace or --describe given"),
        (["--rate", "16", "--iterations", "10000000000000"], "iterations 10000000000000 is invalid"),
        (["--describe", "P3"], "is not valid JSON"),
    ],
)
def test_failure_generator_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], message: str
) -> None:
    r = run_generator(*[str(P3) if a == "P3" else a for a in args], "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_simulator_run_replays_a_downtime_schedule(tmp_path: Path, capsys) -> None:
    from checkfree.telemetry.metrics import read_metrics

    from helpers.cli import run_cli, simulate_argv

    # tiny config: 4 stages × 2 replicas (stage s = nodes 2s, 2s+1); stage 2 loses both at iteration 2,
    # stage 3 runs on one replica in iterations 1–2
    sched = {
        "format": DOWNTIME_FORMAT,
        "stages": 4,
        "replicas": 2,
        "iterations": 4,
        "iteration_seconds": 60.0,
        "slots": {"4": [[1, 3]], "5": [[2, 2]], "6": [[1, 3]]},
    }
    path = tmp_path / "down.json"
    path.write_text(json.dumps(sched))
    run = tmp_path / "run"
    rc, _, err = run_cli(simulate_argv(run, "--failure-schedule", str(path)), capsys)
    assert rc == 0, err
    failures = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "failure"]
    assert [(r["iteration"], r["stage"]) for r in failures] == [(2, 2)]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["short_of_replicas_iterations"] == {"1": 0, "2": 1, "3": 2, "4": 0}
    assert summary["all_replicas_down_iterations"] == {"1": 0, "2": 1, "3": 0, "4": 0}
