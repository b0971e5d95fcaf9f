"""End to end: 2 gloo processes train the tiny config on the default corpus with forced failures."""

import json
import os
import subprocess
import sys

import pytest

from checkfree.failures.schedules import save_stage_schedule
from checkfree.recovery.registry import REGISTRY
from checkfree.telemetry.metrics import read_metrics

from helpers import PYTHONPATH

# failures at iterations 1..4, a consecutive pair at 3, first and last stages at 2 and 4
SCHEDULE = [(1, 2), (2, 1), (3, 2), (3, 3), (4, 4)]


def _settings() -> list[str]:
    out = []
    for name, cls in sorted(REGISTRY.items()):
        out.append(f"{name}:swaps" if cls.swaps else f"{name}:no-swaps")
    return out


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_process_run_for_every_strategy(tmp_path):
    sched = tmp_path / "schedule.json"
    save_stage_schedule(sched, SCHEDULE)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "helpers.e2e_worker",
        str(tmp_path / "out"),
        str(sched),
        str(tmp_path / "cache"),
        *_settings(),
    ]
    (tmp_path / "out").mkdir()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for item in _settings():
        name = item.split(":")[0]
        summary = json.loads((tmp_path / "out" / f"{name}.json").read_text())
        assert summary["strategy"] == name and summary["world_size"] == 2
        assert summary["effective_iterations"] == 6
        assert summary["failures"] == len(SCHEDULE)
        assert summary["replicas_consistent"], name  # both ranks saw the same failures and recoveries
        run = tmp_path / "out" / name
        records = read_metrics(run / "metrics.jsonl")
        assert [(r["iteration"], r["stage"]) for r in records if r["kind"] == "failure"] == SCHEDULE
        if REGISTRY[name].loses_state:
            assert summary["recoveries"] >= 1, name
        assert {"config.json", "command.txt", "summary.json", "rank0.log", "rank1.log"} <= {
            p.name for p in run.iterdir()
        }
        evals = [r["val_loss"] for r in records if r["kind"] == "eval"]
        assert all(v == v and v < 20 for v in evals), (name, evals)  # finite: no NaN leaked from a lost stage
    assert not any(p.suffix in (".log", ".txt") for p in tmp_path.iterdir())  # nothing in the cwd
