"""``--stop-at-loss``: a run ends at its first validation at or below the target; one that reaches a cap first is
censored (not failed), and ``--no-final-checkpoint`` writes no run checkpoint at the end."""

from __future__ import annotations

import json

from helpers.cli import assert_user_error, run_cli, simulate_argv


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def _evals(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "eval"]


def test_a_run_stops_at_its_first_validation_at_or_below_the_target(tmp_path, capsys):
    rc, _, _ = run_cli(simulate_argv(tmp_path / "ref", setting="no_failure", iterations=8), capsys)
    assert rc == 0
    ref = _evals(tmp_path / "ref")
    target = ref[2]["val_loss"]  # the loss at iteration 4 (validations at 0, 2, 4, …)
    assert ref[3]["val_loss"] < target  # still falling: without the stop the run would go on
    argv = simulate_argv(
        tmp_path / "stop", "--stop-at-loss", repr(target), setting="no_failure", iterations=8
    )
    rc, _, _ = run_cli(argv, capsys)
    assert rc == 0
    s = _summary(tmp_path / "stop")
    assert s["status"] == "completed" and s["ended_by"] == "target" and s["stopped"] is None
    assert s["target"] == {
        "loss": target,
        "reached": True,
        "iteration": 4,
        "effective_iteration": 4,
        "val_loss": target,
    }
    assert [e["iteration"] for e in _evals(tmp_path / "stop")] == [0, 2, 4]


def test_a_run_capped_before_the_target_is_censored_not_failed(tmp_path, capsys):
    argv = simulate_argv(
        tmp_path / "cens",
        "--stop-at-loss",
        "0.001",
        "--max-wall-iterations",
        "6",
        "--no-final-checkpoint",
        setting="checkpoint",
        iterations=20,
    )
    rc, _, _ = run_cli([*argv, "--failure-probability", "0.3", "--set", "checkpoint_every=2"], capsys)
    assert rc == 0  # a censored run is a result, not an error
    s = _summary(tmp_path / "cens")
    assert s["status"] == "completed" and s["stopped"] is None and s["ended_by"] == "max_wall_iterations"
    assert s["target"]["reached"] is False and s["target"]["censored_by"] == "max_wall_iterations"
    assert (
        s["target"]["iteration"] == 6 and s["target"]["val_loss"] == _evals(tmp_path / "cens")[-1]["val_loss"]
    )
    resume = tmp_path / "cens" / "checkpoints"
    assert not [p for p in resume.glob("iter_*")]  # --no-final-checkpoint: no run checkpoint at the end
    # without --stop-at-loss the same cap is a failure to finish (exit 1), as before
    rc, _, _ = run_cli(
        simulate_argv(tmp_path / "wall", "--max-wall-iterations", "6", setting="checkpoint", iterations=20)
        + ["--failure-probability", "0.3", "--set", "checkpoint_every=2"],
        capsys,
    )
    assert rc == 1 and _summary(tmp_path / "wall")["status"] == "failed"
    assert [p.name for p in (tmp_path / "wall" / "checkpoints").glob("iter_*")]  # the final one by default


def test_a_target_that_is_no_loss_is_refused_before_anything_is_written(tmp_path, capsys):
    for bad in ("0", "-1", "nan", "inf"):
        rc, _, err = run_cli(simulate_argv(tmp_path / bad, "--stop-at-loss", bad), capsys)
        assert_user_error(rc, err, "--stop-at-loss", "positive validation loss")
        assert not (tmp_path / bad).exists()
