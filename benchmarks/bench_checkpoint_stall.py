"""Checkpoint save stall: ``async`` (DataStates-style) stall divided by ``sync`` stall. Target ≤ 0.2 (small config).

    .venv/bin/python benchmarks/bench_checkpoint_stall.py [--config small_config.json] [--every 2]
        [--iterations 5] [--rounds 2] [--threads 1]

Each round trains the config's model with the ``checkpoint`` strategy (a checkpoint every ``--every``
iterations, no failures) once per save mode, on random token batches (data does not change a save's cost),
and reads the "checkpoint" lines it writes. Stall = seconds the training thread was blocked by a save: the whole
copy + safetensors write + fsync for ``sync``; for ``async`` only what the copy overlapping forward/backward did
not hide, plus any wait for the previous flush. Saves at iteration 0 (no Adam state yet) are left out. The
rounds interleave the modes so machine noise hits both alike; the ratio of the median stalls is printed.
Not a test: it prints what it measured.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from checkfree.config import load_config
from checkfree.failures.injection import StageFailureInjector
from checkfree.model import build_stages
from checkfree.recovery.registry import make_strategy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink, read_metrics


class RandomBatches:
    """Token batches that are a pure function of the step."""

    def __init__(self, batch_size: int, seq_l: int, vocab: int):
        self.shape, self.vocab = (batch_size, seq_l + 1), vocab

    def batch(self, step: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, self.shape, generator=torch.Generator().manual_seed(step))


def stalls(config: str, mode: str, every: int, iterations: int, workdir: Path) -> tuple[list[float], int]:
    """Stall seconds of each save after iteration 0, and the bytes of one save."""
    cfg = load_config(
        config,
        {
            "save_mode": mode,
            "checkpoint_every": every,
            "max_iterations": iterations,
            "eval_interval": 10**9,
            "checkpoint_interval": 0,
        },
    )
    run = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=workdir))
    sink = MetricsSink(run / "metrics.jsonl")
    trainer = Trainer(
        cfg,
        build_stages(cfg, cfg.vocab_size, cfg.seed),
        RandomBatches(cfg.batch_size, cfg.seq_l, cfg.vocab_size),
        [],
        make_strategy("checkpoint", cfg, False),
        StageFailureInjector(cfg.n_stages, 0.0, 0),
        RunContext(sink=sink, checkpoint_dir=run / "checkpoints"),
        swaps=False,
    )
    trainer.strategy.setup(trainer.state)
    for _ in range(iterations):
        trainer.step()
    trainer.strategy.finish(trainer.state)
    sink.close()
    saves = [
        r
        for r in read_metrics(run / "metrics.jsonl")
        if r["kind"] == "checkpoint" and r["purpose"] == "strategy" and r["effective_iteration"] > 0
    ]
    return [r["stall_seconds"] for r in saves], saves[-1]["bytes"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small_config.json")
    ap.add_argument("--every", type=int, default=2, help="iterations between checkpoints (K)")
    ap.add_argument("--iterations", type=int, default=5, help="iterations per run")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved runs of each mode")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the flush gets the rest)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, list[float]] = {"sync": [], "async": []}
    nbytes = 0
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as work:
        for _ in range(args.rounds):
            for mode in results:
                s, nbytes = stalls(args.config, mode, args.every, args.iterations, Path(work))
                results[mode] += s
    sync, asyn = statistics.median(results["sync"]), statistics.median(results["async"])
    print(
        f"config {args.config}: {nbytes / 2**20:.1f} MiB per save, K={args.every}, "
        f"{len(results['sync'])} saves per mode, {time.perf_counter() - t0:.0f} s"
    )
    for mode, values in results.items():
        print(
            f"  {mode:5s} stall per save: median {statistics.median(values):.4f} s "
            f"(min {min(values):.4f}, max {max(values):.4f})"
        )
    print(f"async / sync save stall: {asyn / sync:.3f} (target <= 0.2)")


if __name__ == "__main__":
    main()
