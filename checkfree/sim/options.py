"""The simulator's options: everything ``python -m checkfree simulate`` accepts (docs/simulator.md).

Checked by checkfree.sim.preflight and run by checkfree.sim.launch (which re-exports :class:`SimulateOptions`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class SimulateOptions:
    """Everything ``python -m checkfree simulate`` accepts (docs/simulator.md)."""

    setting: str
    config: str
    world_size: int = 1
    rate: float = 16.0
    start_iter: int = 0
    swaps: bool = True
    run_dir: Path | None = None
    runs_root: Path = Path("runs")
    max_iterations: int | None = None
    eval_interval: int | None = None
    log_interval: int | None = None
    checkpoint_interval: int | None = None
    seed: int | None = None
    failure_seed: int | None = None
    failure_probability: float | None = None
    failure_schedule: Path | None = None
    schedule_replicas: int | None = None
    fail_stage0: bool = False
    grad_norm_mode: str | None = None
    iteration_seconds: float | None = None
    """Iteration time (s) of the %/h formula; None = the paper's 91.32 s (a warning when given but unused)."""
    resume_from: Path | None = None
    device: str = "auto"
    max_train_tokens: int | None = None
    peak_tflops: float | None = None
    compile: bool = False
    compile_backend: str = "inductor"
    compile_mode: str = "default"
    """torch.compile's mode with ``--compile``: "default", or "reduce-overhead" (CUDA graphs: fewer kernel launches)."""
    fused_loss: str = "auto"
    """The head and loss through Liger-Kernel's fused linear cross-entropy: "auto" (where CUDA and liger-kernel
    are), "on" (or a refusal) or "off" (checkfree/loss.py; docs/gpu.md)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block in the backward pass instead of keeping its activations (docs/gpu.md)."""
    autocast: str = "auto"
    tensorboard: bool = False
    cache_dir: Path | None = None
    dry_run: bool = False
    progress: bool = True
    overwrite: bool = False
    """A fresh run into a directory that holds a run moves the old one aside to DIR.replaced-<timestamp>."""
    allow_data_change: bool = False
    """Resume a checkpoint on other data (dataset or tokenizer) than it was trained on, with a warning."""
    max_wall_iterations: int | None = None
    """Stop after this many wall-clock iterations (None = 20 × max_iterations)."""
    stop_at_loss: float | None = None
    """Stop at the first validation whose loss (nats) is ≤ this target; a run that ends at a cap
    (``max_iterations`` or ``max_wall_iterations``) first is *censored* (summary.json ``target``)."""
    final_checkpoint: bool = True
    """Write a run checkpoint when training ends (``--no-final-checkpoint``: only the interval ones)."""
    recovery_accounting: bool = True
    """Add weight distances and probe losses to each recovery record (checkfree.telemetry.recovery_accounting)."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Config-key overrides of other strategies' options (e.g. {"checkpoint_every": 50})."""
