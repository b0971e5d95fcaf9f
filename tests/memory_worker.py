"""Run real training steps of a config on the CPU and print the peak RSS growth and the memory estimate (JSON).

    python tests/memory_worker.py CONFIG [STEPS] [OVERRIDES_JSON] [--activation-checkpointing]

The stages, Adam and a Trainer are built first; then the kernel's peak-RSS mark is reset (``/proc/self/clear_refs``
← 5, Linux ≥ 4.0) and ``STEPS`` iterations run (the second one is the first with Adam state allocated, so its
backward is the steady-state peak). Printed: ``rss_before`` (VmRSS after the build), ``peak`` (VmHWM after the
steps) and the estimate's parts (checkfree.memory.simulator_estimate, CPU, fp32, setting no_failure). The growth
``peak − rss_before`` is what training allocated: gradients, Adam state, activations, temporaries and what glibc's
heaps keep, the estimate's total less the weights and the process (both already in ``rss_before``).
"""

from __future__ import annotations

import gc
import json
import sys

import torch

from checkfree.config import load_config
from checkfree.failures.injection import StageFailureInjector
from checkfree.memory import model_vocab_size, simulator_estimate
from checkfree.model import build_stages
from checkfree.recovery.registry import make_strategy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink


def status(key: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class RandomBatches:
    """Batches of random token ids: (sequences, seq + 1) int64, a pure function of the step."""

    def __init__(self, sequences: int, seq: int, vocab: int) -> None:
        self.sequences, self.seq, self.vocab = sequences, seq, vocab

    def batch(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(step)
        return torch.randint(0, self.vocab, (self.sequences, self.seq + 1), generator=g)


def main(argv: list[str]) -> int:
    checkpointing = "--activation-checkpointing" in argv
    argv = [a for a in argv if a != "--activation-checkpointing"]
    overrides = json.loads(argv[3]) if len(argv) > 3 else None
    cfg = load_config(argv[1], overrides)
    steps = int(argv[2]) if len(argv) > 2 else 2
    vocab = model_vocab_size(cfg)
    source = RandomBatches(cfg.batch_size, cfg.seq_l, vocab)
    stages = build_stages(cfg, vocab, seed=0)
    ctx = RunContext(
        sink=MetricsSink(None), recovery_accounting=False, activation_checkpointing=checkpointing
    )
    strategy = make_strategy("no_failure", cfg, swaps=False)
    failures = StageFailureInjector(cfg.n_stages, 0.0, 0)
    trainer = Trainer(cfg, stages, source, [], strategy, failures, ctx, swaps=False)
    gc.collect()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # resets VmHWM to the current RSS
    rss_before = status("VmRSS")
    for _ in range(steps):
        trainer.step()
    est = simulator_estimate(cfg, vocab, "cpu", False, checkpointing, "no_failure")
    out = {"rss_before": rss_before, "peak": status("VmHWM"), "total": est.total}
    out |= {k: getattr(est, k) for k in ("weights", "gradients", "optimizer", "activations", "temporaries")}
    out["runtime"] = est.runtime
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
