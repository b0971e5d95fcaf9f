"""Staged trainer overhead: time per iteration of checkfree's Trainer (1 process, no failures) divided by a plain
training step of the same transformers model on the same batches. Target ≤ 1.10 on the tiny config.

    .venv/bin/python benchmarks/bench_staged.py [--config tiny_config.json] [--iterations 20] [--rounds 5]

Both loops run interleaved in one process (rounds × iterations each) so machine noise hits both alike; the ratio
of the medians is printed. Not a test: it prints what it measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from checkfree.config import load_config
from checkfree.data.batches import BatchSource
from checkfree.data.corpus import prepare_corpus
from checkfree.failures.injection import StageFailureInjector
from checkfree.model import build_hf_model, split_model
from checkfree.recovery.registry import make_strategy
from checkfree.sim.launch import data_spec
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny_config.json")
    ap.add_argument("--iterations", type=int, default=10, help="iterations per timed block")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved blocks of each loop")
    args = ap.parse_args()
    cfg = load_config(args.config)
    corpus = prepare_corpus(data_spec(cfg))
    batches = BatchSource(corpus.train, cfg.seq_l, cfg.batch_size, seed=cfg.data_seed)

    stages = split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed), cfg)
    trainer = Trainer(
        cfg,
        stages,
        batches,
        [],
        make_strategy("no_failure", cfg, False),
        StageFailureInjector(cfg.n_stages, 0.0, 0),
        RunContext(sink=MetricsSink(None)),
        swaps=False,
    )

    model = build_hf_model(cfg, corpus.vocab_size, cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999))
    plain_step_index = 0

    def plain_step() -> None:
        nonlocal plain_step_index
        opt.zero_grad(set_to_none=True)
        for mb in range(cfg.mb_count):
            batch = batches.batch(plain_step_index * cfg.mb_count + mb)
            logits = model(input_ids=batch[:, :-1]).logits
            loss = (
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)) / cfg.mb_count
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        plain_step_index += 1

    def timed(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(args.iterations):
            fn()
        return (time.perf_counter() - t0) / args.iterations

    timed(trainer.step), timed(plain_step)  # warm-up
    staged, plain = [], []
    for _ in range(args.rounds):
        staged.append(timed(trainer.step))
        plain.append(timed(plain_step))
    s, p = statistics.median(staged), statistics.median(plain)
    print(
        f"config {args.config}: {cfg.n_stages} stages × {cfg.n_layers_per_stage} layers, d={cfg.dmodel}, "
        f"batch {cfg.batch_size} × {cfg.mb_count} × {cfg.seq_l} tokens, torch threads {torch.get_num_threads()}"
    )
    print(
        f"staged trainer : {s * 1000:8.1f} ms/iteration (median of {args.rounds} blocks of {args.iterations})"
    )
    print(f"plain HF step  : {p * 1000:8.1f} ms/iteration")
    print(f"ratio staged/plain = {s / p:.3f}  (target ≤ 1.10: {'met' if s / p <= 1.10 else 'NOT met'})")


if __name__ == "__main__":
    main()
