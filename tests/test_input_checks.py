"""Input that used to be accepted silently: warned about once in the run log, refused, or stopped in time."""

from __future__ import annotations

import json
import random

import pytest

from checkfree.config import ConfigError, config_from_dict, load_config
from checkfree.failures.injection import StageFailureInjector
from checkfree.failures.rates import resolve_failure_probability
from checkfree.sim.progress import WallClockGuard, any_failure_probability, expected_wall_iterations
from checkfree.telemetry.metrics import read_metrics

from helpers import ROOT, make_trainer, tiny_config
from helpers.cli import checksums, run_cli, simulate_argv

pytestmark = pytest.mark.timeout(120)


def test_duplicate_config_key_is_a_warning(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"dmodel": 64, "num_heads": 2, "n_stages": 4, "dmodel": 32}')
    warnings: list[str] = []
    cfg = load_config(path, warnings=warnings)
    assert cfg.dmodel == 32  # the last value wins, as in json.loads
    assert warnings == [f"config {path} gives the key 'dmodel' twice; the last value 32 is used."]


def test_one_probability_range_everywhere(tmp_path):
    """ "16": 1.0 was accepted by the config check and refused by the %/h resolver; now [0, 1) everywhere."""
    with pytest.raises(ConfigError, match=r"'16' is 1.0; expected a per-iteration probability in \[0, 1\)"):
        config_from_dict({"16": 1.0})
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        resolve_failure_probability({}, 16, override=1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        StageFailureInjector(4, 1.0, seed=0)
    cfg = config_from_dict({"16": 0.999})
    assert resolve_failure_probability(cfg.failure_probabilities, 16) == (0.999, 'config["16"]')
    assert StageFailureInjector(4, 0.999, seed=0).probability == 0.999


def test_warnings_appear_once_in_the_run_log(tmp_path, capsys):
    config = json.loads((ROOT / "configs" / "tiny_config.json").read_text())
    text = json.dumps(config)[:-1] + ', "lr": 0.002}'  # "lr" given twice
    (tmp_path / "dup_config.json").write_text(text)
    schedule = tmp_path / "schedule.json"
    failures = [{"iteration": 1, "stage": 2, "note": "x"}, {"iteration": 40, "stage": 1}]
    schedule.write_text(json.dumps({"format": "checkfree-stage-failures-v1", "failures": failures}))
    run = tmp_path / "run"
    argv = simulate_argv(run, "--failure-schedule", str(schedule), "--iteration-seconds", "60", iterations=3)
    argv[argv.index("tiny_config.json")] = str(tmp_path / "dup_config.json")
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err
    log = (run / "rank0.log").read_text()
    for expected in (
        "gives the key 'lr' twice",
        "has entries with unknown keys ['note']; they are ignored",
        "has 1 failure(s) at iterations >= max_iterations 3 (first: 40)",
        '--iteration-seconds 60 is not used: the per-iteration failure probability comes from config["16"]',
    ):
        assert log.count(expected) == 1, (expected, log)


def test_expected_wall_iterations_matches_a_simulation():
    """The closed form 1 + ((1 − q)^−(K − 1) − 1) / q per segment against counting wall-clock iterations of
    rollbacks (the simulator's rule: the failed iteration trains from the checkpoint)."""
    q, every, total = 0.15, 5, 10
    rng, runs, walls = random.Random(0), 20000, 0
    for _ in range(runs):
        done = wall = 0
        while done < total:
            wall += 1
            if rng.random() < q:
                done = done // every * every  # back to the last checkpoint
            done += 1
        walls += wall
    assert walls / runs == pytest.approx(expected_wall_iterations(q, every, total), rel=0.03)
    assert expected_wall_iterations(0.0, 50, 30) == 30


def test_the_issue_case_is_warned_about():
    """Tiny config (4 stages), p = 0.05, K = 50, 30 iterations: ≈ 2,000 wall-clock iterations for 30."""
    q = any_failure_probability(0.05, 4)
    expected = expected_wall_iterations(q, 50, 30)
    assert expected > 10 * 30
    warning = WallClockGuard(30).expected_length_warning(expected)
    assert warning and "--max-wall-iterations 600" in warning
    assert WallClockGuard(30).expected_length_warning(290) is None


def test_default_wall_clock_limit_is_twenty_times_max_iterations(tmp_path):
    cfg = tiny_config(max_iterations=3, checkpoint_every=50, save_mode="memory", eval_interval=100)
    trainer = make_trainer(cfg, "checkpoint", StageFailureInjector(4, 0.5, seed=1))
    summary = trainer.train()
    assert summary["iterations"] == 60 and summary["effective_iterations"] < 3
    assert "stopped at wall-clock iteration 60 (--max-wall-iterations 60)" in summary["stopped"]
    assert 0 <= summary["progress_rate"] < 0.05


def test_a_run_that_cannot_finish_stops_and_keeps_its_files(tmp_path, capsys):
    run = tmp_path / "run"
    argv = simulate_argv(
        run,
        *("--failure-probability", "0.3", "--max-wall-iterations", "12", "--set", "checkpoint_every=50"),
        *("--set", "save_mode=sync", "--set", "log_interval=4"),
        setting="checkpoint",
        iterations=8,
    )
    rc, _, err = run_cli(argv, capsys)
    assert rc == 1
    assert err.count("stopped at wall-clock iteration 12 (--max-wall-iterations 12) with") == 1
    log = (run / "rank0.log").read_text()
    assert "is expected to take" in log and "progress 0." in log
    summary = json.loads((run / "summary.json").read_text())
    assert summary["iterations"] == 12 and summary["stopped"]
    records = read_metrics(run / "metrics.jsonl")
    assert sum(r["kind"] == "train" for r in records) == 12
    assert list((run / "checkpoints").glob("iter_*"))  # resumable from where it stopped
    before = checksums(run)
    rc, _, err = run_cli(argv, capsys)  # the same command again refuses instead of mixing runs
    assert rc == 2 and checksums(run) == before
