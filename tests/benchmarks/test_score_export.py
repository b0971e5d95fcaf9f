"""benchmarks/score_export.py: a swarm run's exported model scored by plain transformers against the run's loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from checkfree.export import export_run
from checkfree.swarm.supervisor.supervisor import Supervisor

from helpers import ROOT
from helpers.swarm import live_config

pytestmark = pytest.mark.slow
SCRIPT = ROOT / "benchmarks" / "score_export.py"


def _score(*args: str) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT}"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.timeout(300)
def test_the_exported_model_scores_the_runs_last_validation_loss_and_a_different_loss_fails(tmp_path: Path):
    cfg = live_config(tmp_path, replicas=1, eval_interval=2)
    run = tmp_path / "run"
    Supervisor(cfg, "ours", {}, iterations=3, run_dir=run, vocab_size=300).run()
    export_run(run, tmp_path / "hf")
    r = _score(str(run), str(tmp_path / "hf"))
    assert r.returncode == 0 and "|diff| 0.00e+00 (within 0.0001)" in r.stdout, r.stdout + r.stderr[-2000:]

    results = json.loads((run / "throughput.json").read_text())
    results["final_eval"]["val_loss"] += 0.01  # a run whose model is not the one it reported
    (run / "throughput.json").write_text(json.dumps(results))
    r = _score(str(run), str(tmp_path / "hf"))
    assert r.returncode == 1 and "beyond 0.0001" in r.stdout, r.stdout + r.stderr[-2000:]


@pytest.mark.timeout(150)
def test_a_directory_that_is_not_a_run_or_not_a_model_is_one_sentence_and_exit_2(tmp_path: Path):
    r = _score(str(tmp_path), str(tmp_path))
    assert r.returncode == 2 and "is not a swarm run directory" in r.stderr and "Traceback" not in r.stderr
