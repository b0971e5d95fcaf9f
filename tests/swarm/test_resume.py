"""The coordinator can die and come back: a supervisor SIGKILLed (as a preempted machine) at a committed iteration,
in the middle of an attempt, in the middle of a commit and in the middle of a recovery is resumed with ``swarm run
--resume RUN_DIR``; it re-adopts the live nodes and the run completes with every iteration committed exactly once.

Real ``python -m checkfree swarm run`` processes on 127.0.0.1 (the tiny model of helpers.swarm, synthetic batches).
The supervisor kills itself at the named point (``CHECKFREE_SUPERVISOR_DIE_AT``,
checkfree.swarm.supervisor.failpoints). Training is deterministic here (one thread per node, the gradients summed in
node-id order, each iteration's batches fixed by its index), so a resumed run that commits each iteration once,
with every replica stepped once per commit, has the loss curve of a run that was never interrupted, bit for bit:
the tests compare the two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from checkfree.export import export_run
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.node.compute import validation_batches_for
from checkfree.swarm.process_identity import AdoptedProcess
from checkfree.swarm.supervisor.failpoints import ENV

from helpers import ROOT
from helpers.swarm import MODEL

pytestmark = pytest.mark.slow

ITERATIONS = 8
GRACE_S = 30.0
"""The nodes' supervisor_grace here: a node left behind by a failed test exits by itself soon."""


def _config(tmp: Path, **extra: object) -> Path:
    """A swarm config file for the CLI: the live tests' tiny swarm (2 replicas of 4 stages, no WAN delay)."""
    (tmp / "model.json").write_text(json.dumps(MODEL))
    cfg = {
        "model_config": str(tmp / "model.json"),
        "replicas": 2,
        "microbatches": 4,
        "in_flight": 2,
        "time_scale": 0.02,
        "data": "synthetic",
        "heartbeat_interval": 0.2,
        "peer_timeout": 3.0,
        "microbatch_timeout": 30,
        "iteration_timeout": 60,
        "recovery_timeout": 60,
        "request_timeout": 15,
        "supervisor_grace": GRACE_S,
        "eval_interval": 0,
        **extra,
    }
    path = tmp / "swarm.json"
    path.write_text(json.dumps(cfg))
    return path


def _swarm(args: list[str], die_at: str | None = None, timeout: float = 150) -> subprocess.CompletedProcess:
    """``swarm run ARGS`` to its end; its output goes through files, not pipes: processes that outlive a killed
    supervisor (its nodes, and the resource tracker they share) would hold a pipe open until they exit."""
    env = {k: v for k, v in os.environ.items() if k != ENV} | ({ENV: die_at} if die_at else {})
    cmd = [sys.executable, "-m", "checkfree", "swarm", "run", *args]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=err, text=True, timeout=timeout)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, done.returncode, out.read(), err.read())


def _journal(run: Path) -> dict:
    return json.loads((run / "journal.json").read_text())


def _reap(run: Path) -> None:
    """Kill what a failed test left of the run's nodes: only the journaled processes (pid and start time)."""
    if (run / "journal.json").is_file():
        for pid, started in _journal(run)["processes"].values():
            AdoptedProcess(pid, started).kill()


def _killed_then_resumed(tmp: Path, point: str, *extra: str, **config: object) -> tuple[dict, str]:
    """Run the swarm (``config``: keys of its config) until the supervisor kills itself at ``point``, resume it;
    (throughput.json, supervisor.log)."""
    run = tmp / "run"
    try:
        first = _swarm(["--setting", "ours", "--config", str(_config(tmp, **config)), "--iterations",
                        str(ITERATIONS), "--run-dir", str(run), *extra], die_at=point)  # fmt: skip
        assert first.returncode == -9, first.stderr[-2000:]  # SIGKILLed: no throughput.json, nodes left alive
        assert not (run / "throughput.json").exists()
        journal = _journal(run)
        assert journal["status"] == "running" and journal["processes"]
        alive = [
            AdoptedProcess(pid, started).poll() is None for pid, started in journal["processes"].values()
        ]
        assert all(alive)  # the nodes wait for a resumed supervisor
        resumed = _swarm(["--resume", str(run)])
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        out = json.loads((run / "throughput.json").read_text())
        for pid, started in _journal(run)["processes"].values():  # reaped by the resumed supervisor
            assert AdoptedProcess(pid, started).wait(15) is not None
        return out, (run / "supervisor.log").read_text()
    finally:
        _reap(run)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[list[float]]:
    """The loss curve of the same swarm, never interrupted."""
    tmp = tmp_path_factory.mktemp("reference")
    done = _swarm(["--setting", "ours", "--config", str(_config(tmp)), "--iterations", str(ITERATIONS),
                   "--run-dir", str(tmp / "run"), "--no-schedule"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads((tmp / "run" / "throughput.json").read_text())
    assert [it for it, _ in out["loss_curve"]] == list(range(ITERATIONS))
    return out["loss_curve"]


def _every_iteration_once(out: dict, reference: list[list[float]]) -> dict:
    """The run completed, each iteration committed once and in order, with the uninterrupted run's losses; returns
    its one outage."""
    assert out["status"] == "completed" and out["iterations_completed"] == ITERATIONS
    assert [it for it, _ in out["loss_curve"]] == list(range(ITERATIONS))  # nothing twice, nothing skipped
    assert out["loss_curve"] == reference  # every replica stepped once per commit: the same training
    assert out["resumes"] == 1 and len(out["coordinator_outages"]) == 1
    outage = out["coordinator_outages"][0]
    assert outage["t_lost"] <= outage["t_resumed"] <= outage["t_adopted"] <= outage["t_next_commit"]
    return outage


@pytest.mark.timeout(400)
def test_killed_at_a_committed_iteration_it_resumes_where_it_was(tmp_path: Path, reference) -> None:
    out, log = _killed_then_resumed(tmp_path, "committed:3", "--no-schedule")
    outage = _every_iteration_once(out, reference)
    assert (
        outage["from_iteration"] == 4
        and outage["iterations_redone"] == []
        and outage["rolled_forward"] is None
    )
    assert outage["adopted"] == list(range(8)) and outage["replaced"] == {}  # every live node re-adopted
    assert out["aborted_attempts"] == 0 and out["crashes_count"] == 0
    assert "resumed: 8 nodes adopted, 0 replaced" in log
    resumed = log[log.index("resuming the run") :]  # its forkserver is ready before any replacement is due
    assert resumed.index("the forkserver is ready") < resumed.index("resumed: 8 nodes adopted")
    again = _swarm(["--resume", str(tmp_path / "run")])
    assert (
        again.returncode == 2 and "ended (completed)" in again.stderr and len(again.stderr.splitlines()) == 1
    )


@pytest.mark.timeout(400)
def test_killed_in_the_middle_of_an_attempt_it_redoes_that_iteration(tmp_path: Path, reference) -> None:
    out, _ = _killed_then_resumed(tmp_path, "begun:4", "--no-schedule")
    outage = _every_iteration_once(out, reference)
    assert (
        outage["iterations_redone"] == [4] and outage["rolled_forward"] is None and outage["replaced"] == {}
    )
    assert (
        out["aborted_attempts"] == 1
    )  # the attempt in flight, aborted everywhere and redone from microbatch 0


@pytest.mark.timeout(400)
def test_killed_in_the_middle_of_a_commit_it_finishes_the_commit_every_node_steps_once(
    tmp_path, reference
) -> None:
    out, log = _killed_then_resumed(tmp_path, "commit-partial:3", "--no-schedule", eval_interval=4)
    outage = _every_iteration_once(out, reference)  # validations (forward only) change no training loss
    assert outage["rolled_forward"] == 3 and outage["iterations_redone"] == [] and outage["replaced"] == {}
    assert "finishing the commit of iteration 3" in log and "1 nodes stepped, 7 step now" in log
    # the model the resumed supervisor gathered loads in transformers and gives its last validation loss
    assert [v["iteration"] for v in out["validation"]] == [0, 4, 8] and out["model"][
        "iteration"
    ] == ITERATIONS
    export_run(tmp_path / "run", tmp_path / "hf")
    cfg = swarm_config_from_dict(json.loads((tmp_path / "swarm.json").read_text()))
    batches = validation_batches_for(cfg.model, cfg.data, MODEL["vocab_size"], tmp_path)
    loss = _transformers_loss(tmp_path / "hf", batches)
    assert abs(loss - out["final_eval"]["val_loss"]) <= 1e-4, (loss, out["final_eval"])


def _transformers_loss(model_dir: Path, batches: list[torch.Tensor]) -> float:
    """An exported model's validation loss as anyone computes it: AutoModelForCausalLM in fp32, token-mean cross
    entropy per (B, T+1) batch, the mean over the batches."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        losses = []
        for batch in batches:
            logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
            losses.append(
                float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)))
            )
    return sum(losses) / len(losses)


@pytest.mark.timeout(400)
def test_killed_in_the_middle_of_a_recovery_it_adopts_or_replaces_the_replacement(
    tmp_path: Path, reference
) -> None:
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"3": [2, 1000]}))  # one replica of stage 1, at iteration 2
    # its death re-routes iteration 2's attempt (issue 39), its replacement starts at the boundary before
    # iteration 3 and recovers in the background (issue 39 point 3): at the boundary before 4 it has joined the
    # swarm and does not serve yet (copying, catching up, or reported and waiting to join)
    out, log = _killed_then_resumed(tmp_path, "recovering:4", "--schedule", str(schedule))
    outage = _every_iteration_once(out, reference)  # a replica's copy is exact: the same losses
    assert out["crashes_count"] == 1 and out["recovered_count"] == 1  # the crash recovered once
    crash = out["crashes"][0]
    assert crash["rule"] == "replica" and crash["node"] == 3 and crash["stage"] == 1
    if (
        9 in outage["adopted"]
    ):  # replacement 9 finished its copy while the supervisor was away: taken as it is
        assert outage["replaced"] == {} and crash["replacement_node"] == 9
    else:  # still fetching, or behind the journal: replaced by node 10, which copies the replica again
        assert list(outage["replaced"]) == ["9"]
        assert any(w in outage["replaced"]["9"] for w in ("still recovering", "version")), outage["replaced"]
        assert crash["replacement_node"] == 10
    assert sorted(set(outage["adopted"]) - {9}) == [0, 1, 2, 4, 5, 6, 7]


@pytest.mark.timeout(300)
def test_nodes_wait_out_their_grace_then_exit_and_a_late_resume_names_what_is_lost(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = _config(tmp_path, supervisor_grace=2.0)
    try:
        first = _swarm(["--setting", "ours", "--config", str(cfg), "--iterations", "6", "--run-dir", str(run),
                        "--no-schedule"], die_at="committed:1")  # fmt: skip
        assert first.returncode == -9
        t_killed = time.monotonic()
        procs = [AdoptedProcess(pid, started) for pid, started in _journal(run)["processes"].values()]
        for proc in procs:  # peer_timeout 3 s, then the grace of 2 s: gone well within 30 s
            assert proc.wait(30) is not None
        assert time.monotonic() - t_killed >= 2.0
        logs = [(run / f"node{n}.log").read_text() for n in range(8)]
        assert all("waiting up to 2 s (supervisor_grace)" in text and "exiting" in text for text in logs)
        late = _swarm(["--resume", str(run)])
        assert late.returncode == 2 and len(late.stderr.strip().splitlines()) == 1, late.stderr[-2000:]
        assert "no node of the run" in late.stderr and "no live replica and no snapshot" in late.stderr
        assert (
            not (run / "throughput.json").exists() and _journal(run)["status"] == "running"
        )  # nothing written
    finally:
        _reap(run)


def test_resume_takes_no_other_option_and_needs_a_journal(tmp_path: Path) -> None:
    given = _swarm(["--resume", str(tmp_path), "--iterations", "5"], timeout=60)
    assert given.returncode == 2 and "--iterations was given too" in given.stderr
    missing = _swarm(["--resume", str(tmp_path)], timeout=60)
    assert missing.returncode == 2 and "holds no journal.json" in missing.stderr
