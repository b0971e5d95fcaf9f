"""Data parallelism in the simulator: 2 real gloo processes (127.0.0.1) each train on half of every batch and
must end where one process ends on the concatenated batch. The all-reduce averages (not sums) the gradients, so
the loss, ω and every gradient and weight match the single-process run up to float rounding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import PYTHONPATH, ROOT, dp_worker
from helpers.net import free_port


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_gloo_processes_equal_one_process_on_the_concatenated_batch(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "helpers.dp_worker", str(tmp_path), str(rank), "2", str(port)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for rank in range(2)
    ]
    _wait(procs)

    reference = dp_worker.build(rank=0, world=1)
    expected = dp_worker.train(reference)
    assert expected["failures"] >= 2 and expected["recoveries"] >= 2  # CheckFree recovery used ω in the run
    want = dp_worker.tensors(reference)
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(2)]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    assert all(r["replicas_consistent"] for r in results)
    assert all(torch.equal(ranks[0][k], ranks[1][k]) for k in want)  # bit-identical replicas
    for got in results:
        assert got["failures"] == expected["failures"] and got["recoveries"] == expected["recoveries"]
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-5)
        for step_got, step_want in zip(got["grad_norms"], expected["grad_norms"], strict=True):
            assert step_got == pytest.approx(step_want, rel=1e-4)  # ω of the averaged gradient
    for key, value in want.items():
        # gradients to rounding; weights to well under one Adam step (lr 3e-3): Adam divides a near-zero gradient
        # entry by its own magnitude, which turns a rounding difference of 1e-12 into a few 1e-5 of weight
        atol = 1e-7 if key.startswith("g.") else 1e-4
        assert torch.allclose(ranks[0][key], value, rtol=1e-4, atol=atol), key


def _simulate(tmp_path: Path, run: str, world: int, port: int) -> list[subprocess.Popen]:
    """`python -m checkfree simulate` on a tiny model as `world` gloo processes (the variables torchrun sets)."""
    cmd = [sys.executable, "-m", "checkfree", "simulate", "--setting", "no_failure", "--no-swaps"]
    cmd += ["--config", "tiny_config.json", "--run-dir", str(tmp_path / run), "--world-size", str(world)]
    cmd += ["--max-iterations", "2", "--no-progress", "--device", "cpu"]
    for kv in ("dmodel=32", "num_heads=2", "seq_l=32", "batch_size=2", "mb_count=1", "eval_interval=1"):
        cmd += ["--set", kv]
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            CHECKFREE_CACHE=str(tmp_path / "cache"),
            PYTHONPATH=str(ROOT),
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    return procs


def _wait(procs: list[subprocess.Popen]) -> None:
    try:
        errors = [p.communicate(timeout=120)[1].decode()[-3000:] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    assert [p.returncode for p in procs] == [0] * len(procs), errors


@pytest.mark.timeout(300)
def test_validation_loss_of_two_replicas_equals_one_and_summary_matches_the_last_eval(tmp_path):
    """Same seed, same weights at iteration 0, same validation batches: W = 2 splits them over its ranks and
    all-reduces, so its validation loss is W = 1's to float rounding. summary.json's final loss is the last eval."""
    _wait(_simulate(tmp_path, "w1", 1, free_port()))
    _wait(_simulate(tmp_path, "w2", 2, free_port()))
    evals = {}
    for run in ("w1", "w2"):
        records = [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        evals[run] = [r for r in records if r["kind"] == "eval"]
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["world_size"] == int(run[1])
        assert summary["final_eval"]["val_loss"] == evals[run][-1]["val_loss"]
        assert summary["final_eval"]["iteration"] == evals[run][-1]["iteration"]
        assert summary["first_eval"]["val_loss"] == evals[run][0]["val_loss"]
    first_w1, first_w2 = evals["w1"][0], evals["w2"][0]
    assert first_w1["iteration"] == first_w2["iteration"] == 0
    assert first_w2["val_loss"] == pytest.approx(first_w1["val_loss"], rel=1e-6)
