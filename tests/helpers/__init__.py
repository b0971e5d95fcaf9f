"""Shared test doubles: the repository's root, a tiny config, a deterministic batch source, scripted failures, a
Trainer factory, a trainer's state as tensors, SIGKILL at a chosen moment and a strict JSON reader.

The submodules hold what one part of the suite shares: ``helpers.cli`` (runs through ``python -m checkfree``),
``helpers.data`` (tiny corpora), ``helpers.net`` (ports), ``helpers.report`` (synthetic run directories),
``helpers.swarm`` (live swarms and their attackers). pytest puts ``tests/`` on ``sys.path`` (pyproject.toml's
``pythonpath``); test modules import only these helpers, never each other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from checkfree.config import Config
from checkfree.model import build_stages
from checkfree.recovery.registry import make_strategy
from checkfree.recovery.stage_copy import take_copy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink

ROOT = Path(__file__).resolve().parents[2]
"""The repository: checkfree/, configs/, the launchers, tests/."""


def sigint_as_in_a_terminal() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT: SIGINT back to its default, as a terminal's
    foreground job has it. A shell without job control (``cmd &`` in a script, ``nohup``) starts its background
    commands with SIGINT ignored, a child inherits that, and Python then installs no KeyboardInterrupt handler:
    the test's Ctrl-C would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
"""PYTHONPATH of a subprocess that imports checkfree and these helpers (``python -m helpers.dp_worker``)."""

VOCAB = 300


def tiny_config(**overrides) -> Config:
    """A model that runs every code path in milliseconds on CPU (4 stages, swaps allowed)."""
    base = dict(
        dataset="Shakespeare",
        dmodel=32,
        num_heads=2,
        n_layers_per_stage=1,
        n_stages=4,
        seq_l=16,
        batch_size=2,
        mb_count=2,
        max_iterations=8,
        lr=3e-3,
        eval_interval=4,
        log_interval=4,
        validation=2,
        vocab_size=VOCAB,
        lr_scale=1.1,
    )
    base.update(overrides)
    return Config(**base)


class RandomBatches:
    """Batches that are a pure function of the step, like checkfree.data.batches.BatchSource."""

    def __init__(self, cfg: Config, vocab: int = VOCAB, seed: int = 0):
        self.cfg, self.vocab, self.seed = cfg, vocab, seed

    def batch(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 100_003 + step)
        return torch.randint(0, self.vocab, (self.cfg.batch_size, self.cfg.seq_l + 1), generator=g)


class ScriptedFailures:
    """{iteration: [stages]}: the failures a test wants, nothing else."""

    def __init__(self, script: dict[int, list[int]] | None = None):
        self.script = script or {}

    def draw(self, iteration: int) -> list[int]:
        return sorted(self.script.get(iteration, []))


def make_trainer(
    cfg: Config,
    setting: str = "no_failure",
    failures=None,
    swaps: bool = False,
    seed: int = 0,
    sink: MetricsSink | None = None,
    checkpoint_dir=None,
    recovery_accounting: bool = True,
) -> Trainer:
    stages = build_stages(cfg, VOCAB, seed)
    batches = RandomBatches(cfg)
    val = [RandomBatches(cfg, seed=99).batch(i) for i in range(cfg.validation)]
    strategy = make_strategy(setting, cfg, swaps, seed=seed)
    ctx = RunContext(
        sink=sink or MetricsSink(None),
        checkpoint_dir=checkpoint_dir,
        recovery_accounting=recovery_accounting,
    )
    return Trainer(cfg, stages, batches, val, strategy, failures or ScriptedFailures(), ctx, swaps=swaps)


def params_of(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for s in trainer.state.stages for p in s.parameters()]


def full_state(trainer, stages=None) -> list[torch.Tensor]:
    """Every parameter and Adam tensor (step included) of the given stages, cloned."""
    st = trainer.state
    out = []
    for s in stages if stages is not None else range(len(st.stages)):
        copy = take_copy(st, s)
        out += list(copy.weights.values())
        out += [
            t
            for i in sorted(copy.optimizer)
            for t in (copy.optimizer[i][k] for k in sorted(copy.optimizer[i]))
        ]
    return out


def same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Equal length and bit-identical tensors, pairwise."""
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def sigkill_when(
    proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout: float, poll: float = 0.05
) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds; fail with ``what`` if it never does within ``timeout`` s,
    and with the process's stderr if it exits first. The process is gone when this returns."""
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, (
                proc.stderr.read().decode()[-2000:] if proc.stderr else "process exited"
            )
            if time.monotonic() > deadline:
                pytest.fail(f"{what} within {timeout:.0f} s")
            time.sleep(poll)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def strict_json(text: str) -> dict:
    """``json.loads`` that refuses the ``NaN`` and ``Infinity`` tokens (RFC 8259) with ValueError."""
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
