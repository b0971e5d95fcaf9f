"""Run by tests/sim/test_data_parallel.py: one of WORLD gloo processes (127.0.0.1) training the tiny config on its
share of every global batch, with seeded failures and CheckFree recovery.

usage: PYTHONPATH=.:tests python -m helpers.dp_worker OUT RANK WORLD PORT
Writes OUT/rank<R>.safetensors (every weight and gradient after the last step) and OUT/rank<R>.json (per-step
loss and ω). :func:`build` is also the test's single-process reference (WORLD = 1: the whole global batch).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from checkfree.failures.injection import StageFailureInjector
from checkfree.model import build_stages
from checkfree.recovery.registry import make_strategy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink

from helpers import VOCAB, RandomBatches, tiny_config

GLOBAL_BATCH = 4
STEPS = 4


class Share:
    """Rows [rank·B/W, (rank+1)·B/W) of each global batch: the data-parallel split of one batch."""

    def __init__(self, source: RandomBatches, rank: int, world: int):
        self.source, self.rank, self.world = source, rank, world

    def batch(self, step: int) -> torch.Tensor:
        rows = GLOBAL_BATCH // self.world
        return self.source.batch(step)[self.rank * rows : (self.rank + 1) * rows]


def build(rank: int, world: int) -> Trainer:
    """The trainer of one rank; world = 1 gives the single-process run on the concatenated batch."""
    cfg = tiny_config(batch_size=GLOBAL_BATCH // world, mb_count=2)
    global_batches = RandomBatches(tiny_config(batch_size=GLOBAL_BATCH))
    val = [global_batches.batch(10_000 + i) for i in range(2)]
    ctx = RunContext(sink=MetricsSink(None), rank=rank, world_size=world)
    return Trainer(
        cfg,
        build_stages(cfg, VOCAB, seed=0),
        Share(global_batches, rank, world),
        val,
        make_strategy("checkfree", cfg, False, seed=0),
        StageFailureInjector(cfg.n_stages, 0.3, seed=5),
        ctx,
        swaps=False,
    )


def train(trainer: Trainer) -> dict:
    """STEPS iterations; returns the per-step loss and ω, and the failures seen."""
    trainer.strategy.setup(trainer.state)
    losses, norms = [], []
    for _ in range(STEPS):
        losses.append(trainer.step())
        norms.append(list(trainer.state.grad_norms))
    return {"losses": losses, "grad_norms": norms, **trainer.counts}


def tensors(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every weight ("w.<stage>.<name>") and gradient ("g.<stage>.<name>") of the trainer, contiguous copies."""
    out = {}
    for s, stage in enumerate(trainer.state.stages):
        for name, p in stage.named_parameters():
            out[f"w.{s}.{name}"] = p.detach().clone().contiguous()
            out[f"g.{s}.{name}"] = p.grad.detach().clone().contiguous()
    return out


def main() -> None:
    from safetensors.torch import save_file

    out, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        trainer = build(rank, world)
        result = train(trainer)
        result["replicas_consistent"] = trainer.replicas_consistent()
        save_file(tensors(trainer), str(out / f"rank{rank}.safetensors"))
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
