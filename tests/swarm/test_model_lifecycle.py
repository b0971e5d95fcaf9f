"""A swarm run is a training run: it is validated like the simulator, its model comes out however it ends, and
snapshots are written while it trains (checkfree.swarm.supervisor.validation, .model_io; the node's side in
checkfree.swarm.node.validation).

Live swarms on 127.0.0.1 (the tiny model of helpers.swarm: d 32, vocab 300, 3 transformer stages, synthetic
batches); the CLI runs are real ``python -m checkfree swarm run`` processes stopped by a signal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from checkfree.checkpoint import store
from checkfree.config import config_from_dict
from checkfree.export import export_run
from checkfree.model import build_hf_model, split_model
from checkfree.report.markdown import swarm_section
from checkfree.report.runs import SwarmRun
from checkfree.swarm.node.compute import validation_batches_for
from checkfree.swarm.supervisor import model_io
from checkfree.swarm.supervisor.summary_table import summary_table
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError
from checkfree.swarm.wire.protocol import Message, MessageType
from checkfree.training_state import TrainingState, make_adam

from helpers import ROOT, sigint_as_in_a_terminal
from helpers.swarm import MODEL, live_config

pytestmark = pytest.mark.slow


def plain_transformers_loss(model_dir: Path, batches: list[torch.Tensor]) -> float:
    """The validation loss of an exported model as anyone would compute it: AutoModelForCausalLM, fp32 on the CPU,
    token-mean cross-entropy per batch, the mean over the batches (the simulator's ``evaluate``)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()  # fp32, as saved
    with torch.no_grad():
        losses = []
        for batch in batches:  # (B, T+1) int64
            logits = model(input_ids=batch[:, :-1]).logits  # (B, T, V)
            losses.append(
                float(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)))
            )
    return sum(losses) / len(losses)


@pytest.mark.timeout(300)
def test_a_run_validates_like_the_simulator_and_its_exported_model_reproduces_the_last_validation_loss(
    tmp_path: Path,
) -> None:
    cfg = live_config(tmp_path, replicas=2, eval_interval=2)
    run = tmp_path / "run"
    out = Supervisor(cfg, "ours", {}, iterations=5, run_dir=run, vocab_size=300).run()
    # validation at iteration 0, every eval_interval and at the end, as the simulator's train()
    assert [v["iteration"] for v in out["validation"]] == [0, 2, 4, 5] and out["validation_given_up"] == []
    assert all(
        math.isfinite(v["val_loss"]) and v["batches"] == MODEL["validation"] for v in out["validation"]
    )
    assert out["validation"][-1]["val_loss"] < out["validation"][0]["val_loss"]  # it trained
    assert out["final_eval"] == out["validation"][-1] and out["first_eval"] == out["validation"][0]
    # the model: one replica per stage, the committed weights, checksummed
    model = out["model"]
    assert model["path"] == "model/iter_0000005" and model["iteration"] == 5 == out["iterations_completed"]
    assert model["bytes"] > 0 and model["seconds"] > 0 and set(model["nodes"]) == {"0", "1", "2", "3"}
    snapshot = store.read_checkpoint(run / model["path"])  # every file's sha256 verified
    assert snapshot.meta["config"]["dmodel"] == MODEL["dmodel"] and snapshot.nbytes == model["bytes"]
    # exported, and scored by plain transformers on the same batches: the swarm's last validation loss
    info = export_run(run, tmp_path / "hf")
    assert info["iteration"] == 5 and info["tokenizer"] is None  # synthetic data: no tokenizer
    batches = validation_batches_for(cfg.model, cfg.data, 300, tmp_path)
    loss = plain_transformers_loss(tmp_path / "hf", batches)
    assert abs(loss - out["final_eval"]["val_loss"]) <= 1e-4, (loss, out["final_eval"])
    # swarm table and report show the validation loss
    assert f"{out['final_eval']['val_loss']:.3f} (" in summary_table([out]).splitlines()[2]
    section = "\n".join(swarm_section([SwarmRun(run, json.loads((run / "throughput.json").read_text()))]))
    assert f"{out['validation'][0]['val_loss']:.4f}" in section and "@ 5" in section


class StoppedSupervisor(Supervisor):
    """Raises SwarmError (as a retry limit does) once ``stop_after`` iterations are committed."""

    stop_after = 3

    def committed(self, it: int, ends: dict | None, ready: dict | None) -> None:
        super().committed(it, ends, ready)
        if self.state.iteration >= self.stop_after:
            raise SwarmError("iteration 3 failed 5 attempts; last: a test's limit.")


@pytest.mark.timeout(240)
def test_a_failed_run_keeps_its_model(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1)
    run = tmp_path / "run"
    with pytest.raises(SwarmError, match="a test's limit"):
        StoppedSupervisor(cfg, "ours", {}, iterations=50, run_dir=run, vocab_size=300).run()
    out = json.loads((run / "throughput.json").read_text())
    assert out["status"] == "failed" and out["iterations_completed"] == 3
    assert out["model"]["iteration"] == 3 and store.read_checkpoint(run / out["model"]["path"]).iteration == 3


@pytest.mark.timeout(240)
def test_a_run_that_lost_a_stage_says_in_one_sentence_why_it_keeps_no_model(tmp_path: Path, caplog) -> None:
    cfg = live_config(tmp_path, replicas=2, eval_interval=0)
    run = tmp_path / "run"
    caplog.set_level(logging.WARNING, logger="checkfree")
    with pytest.raises(SwarmError):  # both stage-0 nodes lost: CheckFree alone cannot rebuild stage 0
        Supervisor(cfg, "ours", {0: [2], 1: [2]}, iterations=10, run_dir=run, vocab_size=300).run()
    out = json.loads((run / "throughput.json").read_text())
    why = "The model is not kept: stage 0 has no serving replica."
    assert out["status"] == "failed" and out["model"] == {"path": None, "why": why}
    assert any(why in r.getMessage() for r in caplog.records) and not (run / "model").exists()
    assert not any(r.exc_info for r in caplog.records)


class InterruptedAfterCommit(Supervisor):
    """Ctrl-C lands just after the commit of iteration ``at`` went out to the nodes (they step whatever follows)."""

    at = 3

    def commit_held(self) -> None:
        super().commit_held()
        current = self.state.current
        if current is not None and current.iteration == self.at:
            raise KeyboardInterrupt


@pytest.mark.timeout(240)
def test_an_interrupt_after_the_commit_went_out_records_the_iteration_the_model_holds(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=2, eval_interval=0)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        InterruptedAfterCommit(cfg, "ours", {}, iterations=50, run_dir=run, vocab_size=300).run()
    out = json.loads((run / "throughput.json").read_text())
    assert out["status"] == "interrupted" and out["iterations_completed"] == 4
    assert out["model"]["iteration"] == 4 and store.read_checkpoint(run / out["model"]["path"]).iteration == 4


class SignalledDuringCommit(Supervisor):
    """SIGINT arrives while the commit of iteration ``at`` is being sent, before any node has it."""

    at = 3

    def commit_held(self) -> None:
        link = self.attempts.link
        broadcast = link.broadcast
        current = self.state.current

        def signal_then_broadcast(kind: str, **meta: object) -> None:
            if kind == "commit" and current is not None and current.iteration == self.at:
                os.kill(os.getpid(), signal.SIGINT)  # Python raises it at the next instruction, unless held
            broadcast(kind, **meta)

        link.broadcast = signal_then_broadcast
        try:
            super().commit_held()
        finally:
            link.broadcast = broadcast


def _interrupted(supervisor: type[Supervisor], tmp_path: Path) -> dict[str, Any]:
    """Run the tiny live swarm under ``supervisor``, which sends itself SIGINT (Python's own handler, even if the
    test runner started ignoring it); its throughput.json."""
    cfg = live_config(tmp_path, replicas=2, eval_interval=0)
    run = tmp_path / "run"
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            supervisor(cfg, "ours", {}, iterations=50, run_dir=run, vocab_size=300).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    return json.loads((run / "throughput.json").read_text())


@pytest.mark.timeout(240)
def test_a_stop_signal_while_the_commit_is_sent_lets_every_node_get_it(tmp_path: Path) -> None:
    out = _interrupted(SignalledDuringCommit, tmp_path)
    assert out["status"] == "interrupted" and out["iterations_completed"] == 4
    assert out["model"]["iteration"] == 4 and out["model"]["nodes"].keys() == {"0", "1", "2", "3"}


class SignalledWhileACommittedReportIsHandled(Supervisor):
    """SIGINT arrives while the supervisor handles the first report of the commit of iteration ``at``: received
    from the socket, not yet taken (the window CI hit: the report lost, the commit unrecorded, the model a step
    ahead of throughput.json)."""

    at = 3
    sent = False

    def handle(self, msg: Message) -> None:
        current = self.state.current
        if (
            not self.sent
            and current is not None
            and current.iteration == self.at
            and current.phase == "commit"
            and msg.type == MessageType.CONTROL
        ):
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)  # Python raises it at the next instruction, unless held
        super().handle(msg)


@pytest.mark.timeout(240)
def test_a_stop_signal_while_a_committed_report_is_handled_still_records_the_commit(tmp_path: Path) -> None:
    out = _interrupted(SignalledWhileACommittedReportIsHandled, tmp_path)
    assert out["status"] == "interrupted" and out["iterations_completed"] == 4
    assert out["model"]["iteration"] == 4


def _cli_swarm(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """``python -m checkfree swarm run`` of the tiny live swarm in its own session (so a Ctrl-C can reach its process
    group, as a terminal's does), training toward 1,000 iterations."""
    cfg = live_config(tmp_path, replicas=2, eval_interval=2)
    raw = cfg.to_json()
    raw.pop("model")
    (tmp_path / "swarm.json").write_text(json.dumps(raw))
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "checkfree", "swarm", "run", "--setting", "ours", "--config"]
    argv += [
        str(tmp_path / "swarm.json"),
        "--no-schedule",
        "--iterations",
        "1000",
        "--run-dir",
        str(run),
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    return proc, run


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop", ["SIGTERM to the supervisor", "Ctrl-C to the process group"])
def test_a_stopped_run_keeps_its_model(tmp_path: Path, stop: str) -> None:
    proc, run = _cli_swarm(tmp_path)
    try:
        deadline = time.monotonic() + 150
        log = run / "supervisor.log"
        while not (log.is_file() and "iteration 2 committed" in log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=30)
            time.sleep(0.2)
        if stop.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # the session this test started, by its id
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    out = json.loads((run / "throughput.json").read_text())
    assert out["status"] == "interrupted" and out["iterations_completed"] >= 3
    model = out["model"]
    assert model["path"] is not None, model
    assert model["iteration"] == out["iterations_completed"]  # the committed weights, nothing half-stepped
    assert store.read_checkpoint(run / model["path"]).iteration == model["iteration"]


@pytest.mark.timeout(240)
def test_a_snapshot_is_written_in_the_background_while_training_goes_on(tmp_path: Path, monkeypatch) -> None:
    write = model_io.write_answers

    def slow_disk(*args, **kwargs):  # a disk that takes 2 s: training must not wait for it
        time.sleep(2.0)
        return write(*args, **kwargs)

    monkeypatch.setattr(model_io, "write_answers", slow_disk)
    cfg = live_config(tmp_path, replicas=2, snapshot_every=2, eval_interval=0)
    run = tmp_path / "run"
    out = Supervisor(cfg, "ours", {}, iterations=60, run_dir=run, vocab_size=300).run()
    snaps = out["snapshots"]
    assert snaps["every"] == 2 and snaps["given_up"] == [] and snaps["count"] >= 2
    first = snaps["written"][0]
    assert first["iteration"] == 2 and first["path"] == "snapshots/iter_0000002"
    meanwhile = [r for r in out["iterations"] if first["t_requested"] < r["t_commit"] < first["t_written"]]
    assert len(meanwhile) >= 3, (
        first,
        [r["t_commit"] for r in out["iterations"]],
    )  # trained while it was written
    assert snaps["newest"] == {
        "path": snaps["written"][-1]["path"],
        "iteration": snaps["written"][-1]["iteration"],
    }
    assert snaps["bytes"] == sum(s["bytes"] for s in snaps["written"]) > 0
    assert first["stall_ratio"] is not None and snaps["stall_ratio"] is not None
    # complete and loadable: checksums verified, then weights and Adam state restored into the unsplit model
    newest = store.read_checkpoint(run / snaps["newest"]["path"])
    m = config_from_dict(newest.meta["config"], "snapshot config")
    stages = split_model(build_hf_model(m, 300, seed=1), m)
    state = TrainingState(stages, [make_adam(s, m.lr) for s in stages], base_lr=m.lr)
    assert store.restore(newest, state, m.n_layers_per_stage)
    assert state.iteration == snaps["newest"]["iteration"]
    steps = {float(st["step"]) for opt in state.optimizers for st in opt.state.values()}
    assert steps == {float(snaps["newest"]["iteration"])}  # Adam stepped once per committed iteration
    assert len(list((run / "snapshots").iterdir())) == model_io.KEEP_SNAPSHOTS
