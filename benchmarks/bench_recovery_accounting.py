"""Cost of the per-failure recovery accounting: its seconds per failure iteration ÷ one training iteration.

    .venv/bin/python benchmarks/bench_recovery_accounting.py [--config tiny_config.json] [--iterations 30]
        [--probability 0.3] [--threads 1]

Trains the config's model with ``checkfree`` (no swaps) on random token batches, with stage failures drawn at
``--probability`` per stage and iteration (high, so that many iterations have failures), and reads the records
it writes: ``accounting_seconds`` of each failure iteration (copying the lost stages, two no-grad forwards of the
probe batch, the distances) and ``seconds`` of each training iteration (forward, backward, step). The accounting
runs only in iterations with a failure, so at a per-iteration failure probability q for any stage the average
overhead is q × the printed ratio (q = 1 − (1 − p)^S; the tiny config at 16 %/h has p = 0.01, S = 4: q ≈ 0.04).
Target: ≤ 0.3 of an iteration per failure iteration. Not a test: it prints what it measured.
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

TARGET = 0.3


class RandomBatches:
    """Token batches that are a pure function of the step."""

    def __init__(self, batch_size: int, seq_l: int, vocab: int):
        self.shape, self.vocab = (batch_size, seq_l + 1), vocab

    def batch(self, step: int) -> torch.Tensor:
        return torch.randint(0, self.vocab, self.shape, generator=torch.Generator().manual_seed(step))


def measure(
    config: str, iterations: int, probability: float, workdir: Path
) -> tuple[list[float], list[float]]:
    """(accounting seconds of each failure iteration, seconds of each training iteration)."""
    cfg = load_config(
        config, {"max_iterations": iterations, "eval_interval": 10**9, "checkpoint_interval": 0}
    )
    batches = RandomBatches(cfg.batch_size, cfg.seq_l, cfg.vocab_size)
    sink = MetricsSink(workdir / "metrics.jsonl")
    trainer = Trainer(
        cfg,
        build_stages(cfg, cfg.vocab_size, cfg.seed),
        batches,
        [batches.batch(10**6)],  # the probe batch (the first validation batch in a real run)
        make_strategy("checkfree", cfg, False),
        StageFailureInjector(cfg.n_stages, probability, 1),
        RunContext(sink=sink),
        swaps=False,
    )
    trainer.strategy.setup(trainer.state)
    for _ in range(iterations):
        trainer.step()
    sink.close()
    records = read_metrics(workdir / "metrics.jsonl")
    per_failure = {r["iteration"]: r["accounting_seconds"] for r in records if r["kind"] == "recovery"}
    train = [r["seconds"] for r in records if r["kind"] == "train"][1:]  # the first iteration warms up
    return list(per_failure.values()), train


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny_config.json")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--probability", type=float, default=0.3, help="per-stage failure probability")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-accounting-") as work:
        accounting, train = measure(args.config, args.iterations, args.probability, Path(work))
    if not accounting:
        raise SystemExit("no failure was drawn; raise --probability or --iterations.")
    acc, it = statistics.median(accounting), statistics.median(train)
    ratio = acc / it
    print(
        f"config {args.config}: {args.iterations} iterations, {len(accounting)} with failures, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print(f"  accounting per failure iteration: median {acc:.4f} s; training iteration: median {it:.4f} s")
    print(f"accounting / iteration: {ratio:.3f} (target <= {TARGET}){'' if ratio <= TARGET else ' missed'}")


if __name__ == "__main__":
    main()
