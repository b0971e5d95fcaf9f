"""More than one machine: two launchers, one "node" each, meet through torchrun's rendezvous on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import ROOT
from helpers.data import micro_config
from helpers.net import free_port


def _launcher(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(ROOT / "simulate_training" / "run_2.sh"), *args],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.timeout(200)
def test_two_nodes_of_one_process_each_train_as_one_data_parallel_world(tmp_path):
    config = micro_config(tmp_path)
    run_dir = tmp_path / "run"
    args = ["no_failure", "2", "16", str(config), "0", "--max-iterations", "2", "--run-dir", str(run_dir)]
    args += ["--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    rendezvous = {"NNODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    nodes = [_launcher(args, NODE_RANK=str(rank), **rendezvous) for rank in (0, 1)]
    outputs = []
    try:
        for proc in nodes:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in nodes:  # only the launchers this test started, by their handles
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["iterations"] == 2 and summary["replicas_consistent"]
    assert (run_dir / "rank0.log").exists() and (run_dir / "rank1.log").exists()
    train = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in train if r["kind"] == "train"] == [2 * 2 * 16 * 2] * 2  # W = 2 replicas


@pytest.mark.timeout(60)
def test_multinode_settings_are_checked_and_passed_to_torchrun():
    def dry(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(ROOT / "simulate_training" / "run.sh"), "no_failure", "4", "16", "tiny_config.json", "0"],
            cwd=ROOT,
            env={**os.environ, "DRY_RUN": "1", **env},
            capture_output=True,
            text=True,
            timeout=50,
        )

    ok = dry(NNODES="2", NODE_RANK="1", MASTER_ADDR="10.0.0.7", MASTER_PORT="29411")
    first = ok.stdout.splitlines()[0]
    assert ok.returncode == 0 and "--standalone" not in first
    assert "--nnodes=2 --node_rank=1 --master_addr=10.0.0.7 --master_port=29411 --nproc_per_node=2" in first
    assert "--world-size 4" in first
    elastic = dry(NNODES="2", TORCHRUN_ARGS="--rdzv-backend=c10d --rdzv-endpoint=10.0.0.7:29400")
    assert (
        "run --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.7:29400 --nproc_per_node=2"
        in elastic.stdout
    )
    extra = dry(TORCHRUN_ARGS="--max-restarts=0")
    assert "--standalone --nnodes=1 --max-restarts=0 --nproc_per_node=4" in extra.stdout
    for env, message in [
        ({"NNODES": "two"}, "NNODES is 'two'"),
        ({"NNODES": "3", "NODE_RANK": "0", "MASTER_ADDR": "x"}, "WORLD_SIZE 4 is not a multiple of NNODES=3"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "x"}, "NODE_RANK is 2; expected 0..1"),
        ({"NNODES": "2", "NODE_RANK": "0"}, "MASTER_ADDR is not set"),
    ]:
        r = dry(**env)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
