"""benchmarks/paper_comparison.sh's scheduling, with stub launchers: every run of the plan happens once, at most
JOBS at a time, and the report is written only after the last run has finished."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.timeout(120)

LAUNCHER = """#!/usr/bin/env bash
# A stub run: counts the runs alive at its start, sleeps, writes summary.json into --run-dir.
while [ $# -gt 0 ]; do [ "$1" = --run-dir ] && dir=$2; shift; done
mkdir "$STUB_ALIVE/$$"
echo "start $(ls "$STUB_ALIVE" | wc -l)" >> "$STUB_LOG"
sleep 0.4
mkdir -p "$dir" && echo '{}' > "$dir/summary.json"
rmdir "$STUB_ALIVE/$$"
echo "end $(basename "$dir")" >> "$STUB_LOG"
"""
PYTHON = """#!/usr/bin/env bash
echo "report $(ls "$STUB_ALIVE" | wc -l)" >> "$STUB_LOG"
"""


def _tree(tmp_path: Path) -> Path:
    box = tmp_path / "box"
    (box / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "paper_comparison.sh", box / "benchmarks")
    for path, text in (
        ("simulate_training/run.sh", LAUNCHER),
        ("simulate_training/run_2.sh", LAUNCHER),
        (".venv/bin/python", PYTHON),
    ):
        f = box / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "alive").mkdir()
    return box


@pytest.mark.parametrize("jobs", [1, 2])
def test_runs_happen_once_at_most_jobs_at_a_time_then_the_report(tmp_path, jobs):
    box = _tree(tmp_path)
    env = os.environ | {
        "STUB_ALIVE": str(tmp_path / "alive"),
        "STUB_LOG": str(tmp_path / "log"),
        "JOBS": str(jobs),
        "RATES": "16",
        "SEEDS": "0 1",
        "STRATEGIES": "random checkfree_plus average",
        "OUT": str(tmp_path / "out"),
    }
    subprocess.run(["bash", "benchmarks/paper_comparison.sh"], cwd=box, env=env, check=True, timeout=60)
    log = (tmp_path / "log").read_text().split("\n")
    starts = [int(line.split()[1]) for line in log if line.startswith("start")]
    ends = sorted(line.split()[1] for line in log if line.startswith("end"))
    assert len(starts) == 10 and len(set(ends)) == 10  # 2 seeds × (2 no-failure + 3 strategies), each once
    assert max(starts) == jobs  # the slots were used, never exceeded
    assert log[-2] == "report 0"  # after every run has finished
    assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == ends


def test_bad_jobs_is_refused_before_anything_runs(tmp_path):
    box = _tree(tmp_path)
    env = os.environ | {"JOBS": "two", "OUT": str(tmp_path / "out")}
    r = subprocess.run(
        ["bash", "benchmarks/paper_comparison.sh"],
        cwd=box,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and r.stderr.strip() == "JOBS is 'two'; expected a positive integer."
    assert not (tmp_path / "out").exists()
