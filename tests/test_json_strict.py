"""Every JSON checkfree writes is strict (RFC 8259: no NaN / Infinity tokens), whatever the numbers are, and the
files of a run are written however it ends (completed, failed, interrupted by SIGTERM).

A diverging run is the case that matters: its NaN loss and infinite gradient norms used to land in
summary.json, throughput.json and checkpoint metadata as bare ``NaN`` / ``Infinity``, which ``jq`` and
``JSON.parse`` refuse. Each file here is parsed with a parser that refuses those tokens; the non-finite numbers
must be ``null`` with a reason (``"nonfinite"``: JSON Pointer → token, checkfree.jsonio), and checkfree's own
readers must get the numbers back.
"""

from __future__ import annotations

import ast
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from checkfree import jsonio
from checkfree.checkpoint.store import list_checkpoints, read_checkpoint
from checkfree.probe.run import ProbeData, ProbeOptions, run_probe
from checkfree.sim.trainer import Trainer
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError, decode, encode
from checkfree.telemetry.metrics import MetricsSink, read_metrics

from helpers import ROOT, VOCAB, RandomBatches, make_trainer, tiny_config
from helpers.cli import run_cli, simulate_argv


def _refuse(token: str) -> Any:
    raise ValueError(f"bare {token} in strict JSON")


def strict(text: str) -> Any:
    """RFC 8259 JSON only: a bare NaN / Infinity / -Infinity raises ValueError (the brief's parser)."""
    return json.loads(text, parse_constant=_refuse)


def strict_files(root: Path) -> dict[str, list[Any]]:
    """Parse every *.json and every line of every *.jsonl under ``root`` strictly; relative path → objects."""
    found: dict[str, list[Any]] = {}
    for path in sorted(root.rglob("*.json")) + sorted(root.rglob("*.jsonl")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines() if path.suffix == ".jsonl" else [text]
        found[str(path.relative_to(root))] = [strict(line) for line in lines if line.strip()]
    return found


def _nonfinite_pointers(objs: list[Any]) -> set[str]:
    return {p for o in objs if isinstance(o, dict) for p in o.get("nonfinite", {})}


# ---------------------------------------------------------------------------------------------- the helper


def test_dumps_writes_null_with_a_reason_and_loads_puts_the_numbers_back() -> None:
    obj = {"loss": math.nan, "curve": [[0, 1.5], [1, math.inf]], "a/b": {"x~": -math.inf}, "t": (1, 2)}
    text = jsonio.dumps(obj, indent=1)
    data = strict(text)
    assert data["loss"] is None and data["curve"][1][1] is None and data["a/b"]["x~"] is None
    assert data["nonfinite"] == {"/loss": "NaN", "/curve/1/1": "Infinity", "/a~1b/x~0": "-Infinity"}
    back = jsonio.loads(text)
    assert math.isnan(back["loss"]) and back["curve"][1][1] == math.inf and back["a/b"]["x~"] == -math.inf
    assert "nonfinite" not in back and back["t"] == [1, 2]
    finite = {"b": [1, 2.5, None, True, "s"], "a": {"1": 0.1}}
    for kw in ({}, {"indent": 1}, {"separators": (",", ":")}, {"sort_keys": True}):
        assert jsonio.dumps(finite, **kw) == json.dumps(finite, **kw)  # finite data: the same bytes as before
    assert jsonio.loads('{"old": NaN}')["old"] != 0  # files written before jsonio still read
    with pytest.raises(json.JSONDecodeError):
        jsonio.loads('{"old": NaN}', strict=True)
    for bad in ('{"a": 1, "nonfinite": {"/a": "NaN"}}', '{"nonfinite": {"/x": "NaN"}}', '{"nonfinite": [1]}'):
        with pytest.raises(json.JSONDecodeError):
            jsonio.loads(bad)
    with pytest.raises(ValueError, match="dict"):
        jsonio.dumps([math.nan])
    with pytest.raises(ValueError, match="nonfinite"):
        jsonio.dumps({"nonfinite": 1, "x": math.nan})


def test_every_json_write_under_checkfree_goes_through_the_strict_helper() -> None:
    """No ``json.dump`` / ``json.dumps`` call is left in checkfree/ outside checkfree/jsonio.py (ast, not grep)."""
    offenders = []
    for path in sorted((ROOT / "checkfree").rglob("*.py")):
        if path.name == "jsonio.py" and path.parent.name == "checkfree":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            f = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(f, ast.Attribute)
                and f.attr in ("dump", "dumps")
                and getattr(f.value, "id", "") == "json"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_the_wire_meta_is_strict_json_and_a_bare_nan_is_malformed() -> None:
    msg = Message(
        MessageType.ITERATION_END, 0, 3, -1, {"stage": 0, "attempt": 1, "loss": math.nan, "tokens": 1}
    )
    frames = [bytes(f) for f in encode(msg)]
    meta = strict(frames[1].decode())
    assert meta["loss"] is None and meta["nonfinite"] == {"/loss": "NaN"}
    assert math.isnan(decode(frames).meta["loss"])  # the diverging loss still reaches the supervisor
    raw = b'{"stage":0,"attempt":1,"loss":NaN,"tokens":1}'
    head = frames[0][:-8] + len(raw).to_bytes(4, "little") + frames[0][-4:]
    with pytest.raises(ProtocolError, match="not UTF-8 JSON"):
        decode([head, raw])


# ---------------------------------------------------------------------------------------------- writers


def _poison(trainer: Trainer, stage: int = 1) -> None:
    with torch.no_grad():
        for p in trainer.state.stages[stage].parameters():
            p.fill_(math.nan)


def test_a_diverging_trainer_writes_strict_metrics_checkpoints_and_probe_files(tmp_path: Path) -> None:
    cfg = tiny_config(max_iterations=4, eval_interval=2, log_interval=1, checkpoint_interval=2)
    run = tmp_path / "run"
    run.mkdir()
    sink = MetricsSink(run / "metrics.jsonl")
    trainer = make_trainer(cfg, "no_failure", sink=sink, checkpoint_dir=run / "checkpoints")
    step = trainer.step

    def diverging_step() -> float:
        if trainer.state.iteration == 2:
            _poison(trainer)
        return step()

    trainer.step = diverging_step  # type: ignore[method-assign]
    trainer.train()
    sink.close()
    files = strict_files(run)
    assert "metrics.jsonl" in files and any(k.endswith("meta.json") for k in files)
    assert "/loss" in _nonfinite_pointers(files["metrics.jsonl"])  # null + reason, not a bare NaN
    losses = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert all(math.isfinite(x) for x in losses[:2]) and all(math.isnan(x) for x in losses[2:])
    newest = list_checkpoints(run / "checkpoints")[-1]
    assert _nonfinite_pointers(files[str((newest / "meta.json").relative_to(run))])  # ω is NaN there
    assert read_checkpoint(newest).iteration == 4  # and it still loads
    data = ProbeData(
        VOCAB, None, lambda seed: RandomBatches(cfg, seed=seed), [RandomBatches(cfg, 99).batch(0)]
    )
    out = tmp_path / "probe"
    run_probe(ProbeOptions(newest, out, ["copy"], stages=[2], seeds=1, steps=1), data)
    probe_files = strict_files(out)
    assert "probe.json" in probe_files and _nonfinite_pointers(probe_files["probe.json"])


def test_a_diverging_simulation_writes_strict_run_report_and_export_files(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    step = Trainer.step

    def diverging_step(self: Trainer) -> float:
        if self.state.iteration == 2:
            _poison(self)
        return step(self)

    monkeypatch.setattr(Trainer, "step", diverging_step)
    run = tmp_path / "run"
    argv = simulate_argv(run, "--checkpoint-interval", "2", setting="no_failure", iterations=4)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err
    files = strict_files(run)
    assert {"summary.json", "config.json", "options.json", "metrics.jsonl"} <= set(files)
    summary = files["summary.json"][0]
    assert summary["status"] == "completed" and summary["cause"] is None
    assert summary["final_train_loss"] is None and "/final_train_loss" in summary["nonfinite"]
    assert math.isnan(jsonio.loads((run / "summary.json").read_text())["final_train_loss"])
    rc, _, err = run_cli(
        ["report", str(run), "--target-loss", "5", "--out", str(tmp_path / "report")], capsys
    )
    assert rc == 0, err
    assert strict_files(tmp_path / "report")  # its marker, at least
    out = tmp_path / "export"
    ckpt = list_checkpoints(run / "checkpoints")[0]  # iteration 2: before the weights went NaN
    rc, _, err = run_cli(["export", str(run), "--out", str(out), "--checkpoint", str(ckpt)], capsys)
    assert rc == 0, err
    provenance = strict_files(out)["checkfree_export.json"][0]
    assert "/final_eval/val_loss" in provenance["nonfinite"]  # the run's NaN final loss, with its reason


@pytest.mark.parametrize("how", ["exception", "SIGTERM"])
def test_a_simulation_that_fails_or_is_terminated_still_writes_its_summary(
    tmp_path: Path, capsys, monkeypatch, how: str
) -> None:
    step = Trainer.step

    def stop_at_2(self: Trainer) -> float:
        if self.state.iteration == 2:
            if how == "exception":
                raise RuntimeError("gloo peer lost")
            os.kill(os.getpid(), signal.SIGTERM)  # checkfree.cli turns it into an interrupt of the run
        return step(self)

    monkeypatch.setattr(Trainer, "step", stop_at_2)
    run = tmp_path / "run"
    argv = simulate_argv(run, "--checkpoint-interval", "1", setting="no_failure", iterations=6)
    handler = signal.getsignal(signal.SIGTERM)
    if how == "exception":
        with pytest.raises(RuntimeError, match="gloo peer lost"):
            run_cli(argv, capsys)
        want = ("failed", "RuntimeError: gloo peer lost")
    else:
        rc, _, err = run_cli(argv, capsys)
        assert rc == 130 and "interrupted at iteration 2" in err.strip().splitlines()[-1], err
        want = ("interrupted", "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) == handler  # main() put the previous handler back
    summary = strict_files(run)["summary.json"][0]
    assert (summary["status"], summary["cause"]) == want
    assert summary["iterations"] == 2 == max(r["iteration"] for r in read_metrics(run / "metrics.jsonl"))


def test_swarm_results_with_nonfinite_numbers_are_strict_and_read_back(tmp_path: Path, capsys) -> None:
    res = Results(SwarmConfig(model_config="tiny_config.json"), "ours", 3)
    res.start()
    ends = {0: {"loss": math.nan, "tokens": 10}}
    res.iteration(0, 1, ends, {0: {"grad_norm": math.inf}, 2: {"grad_norm": 1.0}}, {0: [0], 1: [2]})
    res.finish_early(tmp_path, "failed", "iteration 1 failed 3 attempts")
    data = strict_files(tmp_path)["throughput.json"][0]
    assert (data["status"], data["cause"], data["iterations_executed"]) == (
        "failed",
        "iteration 1 failed 3 attempts",
        1,
    )
    assert {"/loss_curve/0/1", "/iterations/0/loss", "/iterations/0/grad_norms/0"} <= set(data["nonfinite"])
    rc, out, err = run_cli(["swarm", "table", str(tmp_path)], capsys)
    assert rc == 0 and "| ours | 1 (1) |" in out and "nan → nan" in out, err
