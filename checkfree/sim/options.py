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
    """Recovery strategy: no_failure, copy, random, zero, average, checkfree, checkfree_plus, checkpoint, one,
    redundant, ec_snapshot, ladder, or an authors' name (ours-grad-avg, ours-naive, ours-random, ours-zero,
    ours-avg-ablation, whole_model)."""
    config: str
    """Config JSON or YAML (working directory first, then configs/)."""
    world_size: int = 1
    """Data-parallel replicas (torchrun processes)."""
    rate: float = 16.0
    """Stage failure rate in %/h (P); selects config["P"] as the per-iteration probability when present."""
    start_iter: int = 0
    """Resume from this run checkpoint iteration."""
    swaps: bool = True
    """CheckFree+ out-of-order execution on odd microbatches (run.sh; ``--no-swaps``: in order, run_2.sh)."""
    run_dir: Path | None = None
    """Run directory (None = runs/<config>-<strategy>-p<P>-w<W>-seed<S> under ``runs_root``)."""
    runs_root: Path = Path("runs")
    """Parent of default run directories."""
    max_iterations: int | None = None
    eval_interval: int | None = None
    log_interval: int | None = None
    checkpoint_interval: int | None = None
    seed: int | None = None
    failure_seed: int | None = None
    """Seed of the failure draws (None = the config's ``seed``)."""
    failure_probability: float | None = None
    """Per-iteration stage failure probability, overriding config["P"] and the %/h formula."""
    failure_schedule: Path | None = None
    """Replay exact failures from a JSON schedule instead of drawing them."""
    schedule_replicas: int | None = None
    """Replicas per stage when ``failure_schedule`` is a swarm node schedule."""
    fail_stage0: bool = False
    """Let stage 0 (embedding and head) fail too; only checkfree_plus and checkpoints recover it."""
    grad_norm_mode: str | None = None
    iteration_seconds: float | None = None
    """Iteration time (s) of the %/h formula; None = the paper's 91.32 s (a warning when given but unused)."""
    resume_from: Path | None = None
    """Resume from this checkpoint directory."""
    device: str = "auto"
    """Where the stages compute: "auto" (CUDA when torch sees a device, else the CPU), "cpu" or "cuda"."""
    max_train_tokens: int | None = None
    peak_tflops: float | None = None
    """Device peak TFLOP/s for MFU (None = known GPUs, or measured on a CPU)."""
    compile: bool = False
    """torch.compile each stage (docs/gpu.md)."""
    compile_backend: str = "inductor"
    """torch.compile's backend with ``compile`` (tests: "eager"; no flag)."""
    compile_mode: str = "default"
    """torch.compile's mode with ``--compile``: "default", or "reduce-overhead" (CUDA graphs: fewer kernel launches)."""
    fused_loss: str = "auto"
    """The head and loss through Liger-Kernel's fused linear cross-entropy: "auto" (where CUDA and liger-kernel
    are), "on" (or a refusal) or "off" (checkfree/loss.py; docs/gpu.md)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block in the backward pass instead of keeping its activations (docs/gpu.md)."""
    autocast: str = "auto"
    """bf16 autocast: "auto" (on CUDA), "bf16" (on any device: the CUDA mixed-precision path on a CPU, for tests)
    or "off"."""
    tensorboard: bool = False
    """Write TensorBoard scalars to RUN_DIR/tensorboard/."""
    cache_dir: Path | None = None
    """Token and tokenizer cache (None = $CHECKFREE_CACHE or ~/.cache/checkfree)."""
    dry_run: bool = False
    """Print the plan and parameter counts; train nothing."""
    progress: bool = True
    """A tqdm bar (drawn on a terminal only)."""
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
