"""benchmarks/table2_6x2.sh's plan (DRY_RUN=1): the set the Table 2 study promises, every run's options as fixed
before any result, and each kind of command accepted by the simulator's own checks."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess

import pytest

from helpers import ROOT
from helpers.cli import run_cli

pytestmark = pytest.mark.timeout(300)


def _plan(**env: str) -> list[str]:
    r = subprocess.run(
        ["bash", "benchmarks/table2_6x2.sh"],
        cwd=ROOT,
        env=os.environ | {"DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if not line.startswith("#")]


def test_the_plan_is_the_promised_set():
    plan = _plan()
    runs = [line for line in plan if line.startswith("simulate_training/")]
    names = [re.search(r"--run-dir \S+/(\S+)", line).group(1) for line in runs]
    assert len(names) == len(set(names)) == 6 + 5 + 2 * (5 + 6 + 6) + 3 + 3
    assert sorted(n for n in names if "nofail-noswap" in n) == [
        f"tiny_6x2-nofail-noswap-s{s}" for s in range(6)
    ]
    for rate, seeds in (("5", range(5)), ("10", range(6)), ("16", range(6))):
        for s in seeds:
            assert (
                f"tiny_6x2-r{rate}-checkfree_plus-s{s}" in names
                and f"tiny_6x2-r{rate}-checkfree-s{s}" in names
            )
        assert f"tiny_6x2-r{rate}-checkpoint-s0" in names and f"tiny_6x2-r{rate}-redundant-s0" in names
    for line in runs:
        name = re.search(r"--run-dir \S+/(\S+)", line).group(1)
        plus = "checkfree_plus" in name or "nofail-swap" in name
        assert line.startswith("simulate_training/run.sh" if plus else "simulate_training/run_2.sh"), line
        if "nofail-noswap" in name:  # the targets: no stop, exactly N_T iterations
            assert "--max-iterations 300" in line and "--stop-at-loss" not in line
        else:
            seed = name.rsplit("-s", 1)[1]
            assert f"--stop-at-loss TARGET_s{seed}" in line and "--max-iterations 750" in line
        if "checkpoint" in name or "redundant" in name:
            assert "--max-wall-iterations 750" in line
        if "checkpoint" in name:  # the authors' rule at the paper's granularity: K = 3 stands for 100
            assert "--set checkpoint_rule=authors --set checkpoint_paper_interval=100" in line
        assert "--eval-interval 25" in line and "--no-final-checkpoint" in line
    report = plan[-1]
    assert report.startswith("python -m checkfree report runs/table2_6x2/runs")
    for part in (
        "--target-loss nofail@300",
        "--replay-baselines",
        "--iteration-seconds 3044",
        "--recovery-seconds 30",
        "--redundant-ratio paper",
        "--checkpoint-rule authors",
    ):
        assert part in report


def test_each_kind_of_run_passes_the_simulator_checks(tmp_path, capsys):
    plan = _plan(OUT=str(tmp_path / "set"))
    kinds = {}
    for line in plan:
        if line.startswith("simulate_training/"):
            name = re.search(r"--run-dir \S+/(\S+)", line).group(1)
            kinds.setdefault(re.sub(r"-s\d+$", "", re.sub(r"-r\d+-", "-r-", name)), line)
    assert len(kinds) == 6
    for line in kinds.values():
        argv = shlex.split(line.replace("TARGET_s0", "4.5").replace("TARGET_s1", "4.5"))
        launcher, setting, world, rate, config, start = argv[:6]
        cli = ["simulate", "--setting", setting, "--world-size", world, "--rate", rate, "--config", config]
        cli += [
            "--start-iter",
            start,
            "--no-swaps" if launcher.endswith("run_2.sh") else "--swaps",
            *argv[6:],
        ]
        rc, out, err = run_cli([*cli, "--dry-run"], capsys)
        assert rc == 0, (line, err)
        assert "tiny_6x2_config.json: LLaMa d=128 heads=4 6 stages × 2 layers" in out


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"N_T": "310"}, "not a multiple of EVAL"),
        ({"JOBS": "0"}, "JOBS is '0'"),
        ({"SEEDS_5": "0 x"}, "a seed is 'x'"),
        (
            {"ONLY": "["},
            "ONLY is '[', which is not an extended regular expression",
        ),  # grep's error: exit 0 before
        ({"ONLY": "a{99999999999}"}, "which is not an extended regular expression"),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(tmp_path, env, fragment):
    r = subprocess.run(
        ["bash", "benchmarks/table2_6x2.sh"],
        cwd=ROOT,
        env=os.environ | {"OUT": str(tmp_path / "out"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and fragment in r.stderr
    assert not (tmp_path / "out").exists()


def test_only_splits_the_set_between_instances():
    whole = {line for line in _plan() if line.startswith("simulate_training/")}
    low = {line for line in _plan(ONLY="-r5-|nofail") if line.startswith("simulate_training/")}
    high = {line for line in _plan(ONLY="-r1[06]-") if line.startswith("simulate_training/")}
    assert low | high == whole and not low & high
    assert all("-r10-" in line or "-r16-" in line for line in high)


def test_a_resumed_set_skips_completed_runs_and_runs_a_stopped_one_again(tmp_path):
    """SKIP_EXISTING: a run whose summary.json says completed is skipped; a run stopped by SIGTERM also wrote a
    summary.json ("interrupted") and is moved to OUT/incomplete/ and run again (before: skipped as done, and its
    loss at the stop read as the run's outcome)."""
    out = tmp_path / "set"
    done, stopped = out / "runs" / "tiny_6x2-nofail-noswap-s0", out / "runs" / "tiny_6x2-nofail-noswap-s1"
    for d, status in ((done, "completed"), (stopped, "interrupted")):
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"status": status, "cause": None}))
    r = subprocess.run(
        ["bash", "benchmarks/table2_6x2.sh"],
        cwd=ROOT,
        env=os.environ | {"SMOKE": "1", "SEEDS_5": "0 1", "ONLY": "nofail-noswap", "OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    progress = (out / "progress.log").read_text()
    assert "skip tiny_6x2-nofail-noswap-s0 (done)" in progress, r.stderr
    assert "skip tiny_6x2-nofail-noswap-s1" not in progress
    assert "tiny_6x2-nofail-noswap-s1: exit 0" in progress, (progress, r.stderr)
    assert json.loads((stopped / "summary.json").read_text())["status"] == "completed"
    [aside] = (out / "incomplete").iterdir()
    assert aside.name.startswith("tiny_6x2-nofail-noswap-s1-")
    assert json.loads((aside / "summary.json").read_text())["status"] == "interrupted"
