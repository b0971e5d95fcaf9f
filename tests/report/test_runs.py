"""The report reads recovery records as the one schema (checkfree/recovery/record.py): runs archived before it
(benchmarks/results/, whose numbers the README's tables are computed from) and runs written with it alike."""

import json

import pytest

from checkfree.report.runs import Run, SwarmRun, load_run

from helpers import ROOT

ARCHIVE = ROOT / "benchmarks" / "results"
SIM_RUN = ARCHIVE / "paper_tiny_low" / "runs" / "tiny_config-r5-checkfree-s1"
SWARM_RUN = ARCHIVE / "trace_p3" / "swarm" / "swarm-p3-ours"


def _raw_lines(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_an_archived_simulator_run_reads_its_old_recovery_keys_as_the_schema():
    run = load_run(SIM_RUN)
    assert isinstance(run, Run)
    old = [r for r in _raw_lines(SIM_RUN) if r["kind"] == "recovery"]
    new = run.kind("recovery")
    assert len(new) == len(old) >= 5 and "sources" in old[0] and "seconds" in old[0]
    for o, n in zip(old, new, strict=True):
        assert (n["source_stages"], n["latency_s"], n["omegas"]) == (o["sources"], o["seconds"], o["omega"])
        assert n["source_nodes"] is None and n["loss_spike"] == o["loss_spike"]
    assert [s for _, s in run.costs().recoveries] == [o["seconds"] for o in old]


def test_an_archived_swarm_run_names_its_source_nodes_and_reads_the_one_latency_key():
    swarm = load_run(SWARM_RUN)
    assert isinstance(swarm, SwarmRun)
    rows = json.loads((SWARM_RUN / "throughput.json").read_text())["crashes"]
    served = [r for r in rows if "latency_s" in r]
    assert swarm.recovery_latencies == [r["latency_s"] for r in served] and len(served) >= 100
    first = swarm.recoveries[0]
    assert (first["source_nodes"], first["source_stages"]) == (rows[0]["sources"], rows[0]["source_stages"])
    assert "sources" not in first and swarm.missing == []


@pytest.mark.parametrize(
    "key", ["latency_seconds", "recovery_seconds", "seconds", "crash_to_serving_seconds"]
)
def test_a_swarm_latency_is_read_from_latency_s_alone(tmp_path, key):
    """No other key is guessed at: a crash row without ``latency_s`` has no latency."""
    run = tmp_path / "swarm"
    run.mkdir()
    rows = [{"node": 1, "stage": 1, "rule": "copy", "latency_s": 2.0}, {"node": 2, "stage": 2, key: 9.0}]
    (run / "throughput.json").write_text(json.dumps({"setting": "ours", "crashes": rows}))
    assert load_run(run).recovery_latencies == [2.0]
