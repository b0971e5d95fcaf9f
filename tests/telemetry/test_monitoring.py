"""Live monitoring: the progress bar only on a terminal, TensorBoard scalars, and the throughput fields of a real
run's records and summary."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

from checkfree.telemetry.metrics import read_metrics
from checkfree.telemetry.monitoring import is_terminal, progress_bar

from helpers import ROOT
from helpers.data import micro_config


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_is_drawn_on_a_terminal_only(tmp_path):
    assert progress_bar(10, 0, "x", stream=io.StringIO()) is None
    with open(tmp_path / "log.txt", "w") as f:
        assert not is_terminal(f) and progress_bar(10, 0, "x", stream=f) is None
    closed = io.StringIO()
    closed.close()
    assert not is_terminal(closed)
    term = FakeTerminal()
    bar = progress_bar(10, 2, "x", stream=term)
    assert bar is not None
    bar.n = 5
    bar.refresh()
    bar.close()
    assert "\r" in term.getvalue() and "5/10" in term.getvalue()


@pytest.mark.timeout(120)
def test_a_redirected_run_logs_lines_and_writes_tensorboard_and_throughput(tmp_path):
    # tensorboard is pinned in requirements.txt: without it this test fails, as a user's --tensorboard would
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = micro_config(tmp_path)
    run_dir = tmp_path / "run"
    with open(tmp_path / "stderr.log", "w") as err:  # not a terminal: no bar frames
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "checkfree",
                "simulate",
                "--setting",
                "checkfree_plus",
                "--config",
                str(config),
            ]
            + [
                "--failure-probability",
                "0.3",
                "--run-dir",
                str(run_dir),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
            + ["--tensorboard", "--peak-tflops", "0.05"],
            cwd=ROOT,
            stderr=err,
            stdout=subprocess.PIPE,
            timeout=110,
        )
    log = (tmp_path / "stderr.log").read_bytes().decode()  # read_text would turn "\r" into "\n"
    assert proc.returncode == 0, log[-2000:]
    assert "\r" not in log and log.count("| loss ") == 4 and "tok/s | MFU" in log
    assert "token budget 272 = 4 iterations × 2 microbatches × 2 sequences × W 1 × 17 tokens" in log

    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert len(train) == 4 and all(r["tokens_per_second"] > 0 for r in train)
    flops = json.loads((run_dir / "summary.json").read_text())["model_flops_per_token"]
    for r in train:  # mfu = model FLOPs × tokens/s ÷ peak, per record
        assert r["mfu"] == pytest.approx(flops * r["tokens_per_second"] / 0.05e12, rel=1e-3, abs=1e-6)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["peak_flops_source"] == "--peak-tflops 0.05" and summary["peak_memory_bytes"] > 10**7
    assert summary["peak_memory_source"] == "process max RSS" and summary["tokens_per_second"] > 0

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/tokens_per_second", "train/mfu", "eval/val_loss", "eval/perplexity"} <= tags
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2, 3]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([r["loss"] for r in train])
    failures = [r for r in records if r["kind"] == "failure"]
    recoveries = [r for r in records if r["kind"] == "recovery"]
    assert failures and recoveries  # p = 0.3 per stage and iteration: seeded, so always some
    assert [e.value for e in events.Scalars("failure/stage")] == [r["stage"] for r in failures]
    assert len(events.Scalars("recovery/count")) == len(recoveries)
