"""The trainer: paired failures, no_failure ≡ p = 0, bitwise resume, crash-safe metrics."""

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from checkfree.failures.injection import StageFailureInjector
from checkfree.sim.trainer import learning_rate
from checkfree.telemetry.metrics import MetricsSink, read_metrics

from helpers import (
    ROOT,
    ScriptedFailures,
    make_trainer,
    params_of,
    sigint_as_in_a_terminal,
    sigkill_when,
    tiny_config,
)


def train(trainer, iterations):
    trainer.strategy.setup(trainer.state)
    for _ in range(iterations):
        trainer.step()


def test_no_failure_with_failures_drawn_equals_probability_zero(caplog):
    cfg = tiny_config()
    a = make_trainer(cfg, "no_failure", StageFailureInjector(4, 0.5, seed=1))
    b = make_trainer(cfg, "no_failure", StageFailureInjector(4, 0.0, seed=1))
    with caplog.at_level(logging.INFO, logger="checkfree.sim.trainer"):
        train(a, 6)
    train(b, 6)
    assert a.counts["failures"] > 0 and b.counts["failures"] == 0
    # the log does not claim a stage failed in a run where nothing is lost
    assert "loses nothing" in caplog.text and " failed" not in caplog.text
    assert all(torch.equal(x, y) for x, y in zip(params_of(a), params_of(b), strict=True))


def test_every_strategy_sees_the_same_failures(tmp_path):
    cfg = tiny_config()
    events = {}
    for setting in ["no_failure", "copy", "checkfree"]:
        sink = MetricsSink(tmp_path / f"{setting}.jsonl")
        train(make_trainer(cfg, setting, StageFailureInjector(4, 0.3, seed=7), sink=sink), 8)
        sink.close()
        events[setting] = [
            (r["iteration"], r["stage"])
            for r in read_metrics(tmp_path / f"{setting}.jsonl")
            if r["kind"] == "failure"
        ]
    assert len(events["copy"]) >= 3
    assert events["no_failure"] == events["copy"] == events["checkfree"]


def test_failed_stage_is_recovered_and_logged(tmp_path):
    cfg = tiny_config()
    sink = MetricsSink(tmp_path / "m.jsonl")
    t = make_trainer(cfg, "checkfree", ScriptedFailures({2: [2, 3]}), sink=sink)
    train(t, 4)
    sink.close()
    recs = [r for r in read_metrics(tmp_path / "m.jsonl") if r["kind"] == "recovery"]
    got = [(r["iteration"], r["stage"], r["source_stages"]) for r in recs]
    assert got == [(2, 2, [1, 4]), (2, 3, [1, 4])]
    assert all(r["consecutive"] for r in recs)
    assert all(torch.isfinite(p).all() for p in params_of(t))


@pytest.mark.parametrize(
    ("setting", "overrides", "at", "expected"),
    [
        # the rollback is written while the strategy recovers: after the failure, before the recovery lines
        ("checkpoint", dict(checkpoint_every=2, save_mode="memory"), 3, ["failure", "rollback", "recovery"]),
        # a snapshot round due at iteration 4 is taken at the iteration's start, before the stage is lost
        ("ec_snapshot", {"snapshot_every": 2}, 4, ["snapshot", "failure", "recovery"]),
    ],
)
def test_a_strategys_lines_are_written_when_its_hooks_produce_them(setting, overrides, at, expected):
    t = make_trainer(tiny_config(**overrides), setting, ScriptedFailures({at: [2]}))
    lines: list[dict] = []
    t.ctx.sink.write = lambda kind, **fields: lines.append({"kind": kind, **fields})
    train(t, at + 1)
    kinds = [r["kind"] for r in lines if r.get("iteration") == at and r["kind"] != "checkpoint"]
    assert kinds == [*expected, "train"]
    recovery = next(r for r in lines if r["kind"] == "recovery")
    assert recovery["iteration"] == at and recovery["latency_s"] >= 0 and recovery["source_nodes"] is None


def test_resume_equals_uninterrupted_run_bitwise(tmp_path):
    cfg = tiny_config(max_iterations=8, checkpoint_interval=4, eval_interval=100)
    failures = ScriptedFailures({2: [1], 5: [3], 6: [0]})
    full = make_trainer(cfg, "checkfree_plus", failures, swaps=True, checkpoint_dir=tmp_path / "a")
    full.train()

    first = make_trainer(cfg, "checkfree_plus", failures, swaps=True, checkpoint_dir=tmp_path / "b")
    first.strategy.setup(first.state)
    for _ in range(4):
        first.step()
    path = first.save_checkpoint()
    assert path.name == "iter_0000004"

    resumed = make_trainer(
        cfg,
        "checkfree_plus",
        failures,
        swaps=True,
        seed=123,  # other init: must be overwritten
        checkpoint_dir=tmp_path / "c",
    )
    resumed.resume(path)
    assert resumed.state.iteration == 4 and resumed.state.effective_iteration == 4
    resumed.train()
    assert all(torch.equal(x, y) for x, y in zip(params_of(full), params_of(resumed), strict=True))
    for o1, o2 in zip(full.state.optimizers, resumed.state.optimizers, strict=True):
        for p1, p2 in zip(o1.param_groups[0]["params"], o2.param_groups[0]["params"], strict=True):
            assert torch.equal(o1.state[p1]["exp_avg_sq"], o2.state[p2]["exp_avg_sq"])


def test_gpt_learning_rate_schedule():
    cfg = tiny_config(architecture="GPT", lr=1.0, warmup_iterations=10, max_iterations=110)
    assert learning_rate(cfg, 0) == pytest.approx(0.1)
    assert learning_rate(cfg, 9) == pytest.approx(1.0)
    assert learning_rate(cfg, 110) == pytest.approx(0.1)
    assert learning_rate(tiny_config(lr=0.5), 1000) == 0.5  # LLaMa: constant


def test_validation_loss_is_mean_cross_entropy():
    t = make_trainer(tiny_config())
    val, ppl = t.evaluate()
    assert abs(val - torch.log(torch.tensor(300.0)).item()) < 0.5  # untrained: ≈ ln(vocabulary)
    assert ppl == pytest.approx(torch.exp(torch.tensor(val)).item(), rel=1e-6)


@pytest.mark.timeout(180)
def test_sigkill_leaves_parseable_metrics(tmp_path):
    """A run killed with SIGKILL mid-training leaves a metrics.jsonl in which every line parses."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, CHECKFREE_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "checkfree",
        "simulate",
        "--setting",
        "checkfree",
        "--no-swaps",
        "--config",
        "tiny_config.json",
        "--run-dir",
        str(run_dir),
        "--max-iterations",
        "100000",
        "--failure-probability",
        "0.2",
        "--no-progress",
        "--set",
        "dmodel=32",
        "--set",
        "num_heads=2",
        "--set",
        "seq_l=32",
        "--set",
        "batch_size=2",
        "--set",
        "mb_count=1",
        "--set",
        "log_interval=1",
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics = run_dir / "metrics.jsonl"
    sigkill_when(
        proc,
        lambda: metrics.exists() and metrics.read_text().count('"kind":"recovery"') >= 2,
        "the run never logged two recoveries",
        150,
    )
    lines = metrics.read_text().splitlines()
    assert len(lines) > 5
    kinds = {json.loads(line)["kind"] for line in lines}  # every line parses
    assert {"train", "failure", "recovery", "eval"} <= kinds
    assert not list(tmp_path.glob("*.log")) and not (tmp_path / "log0.txt").exists()  # nothing in the cwd


@pytest.mark.timeout(180)
def test_ctrl_c_says_where_to_resume_and_keeps_the_run(tmp_path):
    """SIGINT mid-training: exit 130, one last line on stderr (after the log lines) naming the last run checkpoint for --resume-from (no
    traceback), every metrics line parses, and summary.json says "interrupted"."""
    import signal
    import time

    run_dir = tmp_path / "run"
    env = dict(os.environ, CHECKFREE_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "checkfree", "simulate", "--setting", "checkfree", "--no-swaps"]
    cmd += ["--config", "tiny_config.json", "--run-dir", str(run_dir), "--max-iterations", "100000"]
    cmd += ["--no-progress", "--checkpoint-interval", "2", "--failure-probability", "0.1"]
    for kv in ("dmodel=32", "num_heads=2", "seq_l=32", "batch_size=2", "mb_count=1", "log_interval=1"):
        cmd += ["--set", kv]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=sigint_as_in_a_terminal,
    )
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 150
        while not (metrics.exists() and metrics.read_text().count('"kind":"checkpoint"') >= 1):
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the run never wrote a run checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "Traceback" not in err.decode() and "KeyboardInterrupt" not in err.decode(), err.decode()[-2000:]
    # one line, the last one (the log lines of the run come before it)
    assert [line for line in lines if "interrupted" in line] == lines[-1:]
    last = sorted((run_dir / "checkpoints").glob("iter_*"))[-1]
    assert lines[-1].startswith("checkfree simulate: interrupted at iteration")
    assert f"--resume-from {last}" in lines[-1]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line parses
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["resume_from"] == str(last)
    assert summary["iterations"] >= max(r["iteration"] for r in records if r["kind"] == "train")
