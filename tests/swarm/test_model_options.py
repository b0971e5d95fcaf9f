"""The options of a swarm run's model (validation, snapshots) and its export, as a user meets them: a wrong value
is one sentence and exit 2, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli import assert_user_error, run_cli


@pytest.mark.parametrize(
    "option, words",
    [
        (["--set", "eval_interval=-1"], ["'eval_interval' is -1", "an integer in [0, 100,000,000], or null"]),
        (
            ["--set", "eval_interval=2.5"],
            ["'eval_interval' is 2.5", "an integer in [0, 100,000,000], or null"],
        ),
        (["--snapshot-every", "-3"], ["'snapshot_every' is -3", "an integer in [0, 100,000,000]"]),
    ],
)
def test_a_wrong_validation_or_snapshot_interval_is_one_sentence(
    tmp_path: Path, capsys, option, words
) -> None:
    argv = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--no-schedule", "--dry-run"]
    rc, _, err = run_cli([*argv, "--run-dir", str(tmp_path / "run"), *option], capsys)
    assert_user_error(rc, err, *words)
    assert not (tmp_path / "run").exists()


def test_exporting_a_swarm_run_that_kept_no_model_says_why(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    why = "The model is not kept: stage 0 has no serving replica."
    (run / "throughput.json").write_text(json.dumps({"setting": "ours", "model": {"path": None, "why": why}}))
    rc, _, err = run_cli(["export", str(run), "--out", str(tmp_path / "hf")], capsys)
    assert_user_error(rc, err, f"the swarm run {run} holds no model: {why}")
    assert not (tmp_path / "hf").exists()
