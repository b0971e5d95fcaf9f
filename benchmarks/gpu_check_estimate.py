"""How long each gpu_check section should take on one H100, and how much memory its runs need there.

Expected seconds of one simulator run (``SimRun``) on an H100 SXM, before it has ever run on one:

    compute   = (iterations × tokens/iteration × F × r + 2 × validation tokens × F / 3) ÷ (MFU × 989 TFLOP/s)
                + iterations × ITERATION_OVERHEAD_S
    start-up  = parameters ÷ INIT_PARAMS_PER_S + RUN_SETUP_S (+ COMPILE_S with --compile)

F = model FLOPs per token, 6·N + 12·L·d·T (checkfree/telemetry/throughput.py; PaLM appendix B); r = 4/3 with
activation checkpointing (each block's forward runs twice: 8·N instead of 6·N); the validation runs twice (at
the start and the end), forward only (F / 3). MFU is :data:`ASSUMED_MFU`: 30 % under bf16 autocast (below the
40 % target, so the estimate errs long), 15 % in fp32 (TF32 matmuls: half the bf16 peak), 40 % compiled. A
token cache built for the first time adds :data:`DATA_PREP_S`. Sections that are not FLOP-bound (the recovery
comparison, the swarm) have a stated constant. Memory is checkfree/memory.py's estimate on CUDA under the run's
autocast and loss path (a run whose ``fused_loss`` is not "off" is estimated on the fused path: on the GPU
machine ``./setup.sh --system-torch`` installs liger-kernel), the same number preflight checks against the GPU
before a run starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from checkfree import memory as M
from checkfree.config import Config
from checkfree.telemetry.throughput import model_flops_per_token

H100_PEAK_FLOPS = 989e12
"""Dense bf16 peak of an H100 SXM (checkfree/telemetry/throughput.py: PEAK_TFLOPS "NVIDIA H100 80GB HBM3")."""
H100_MEMORY = 81559 * 2**20
"""An 80 GB H100 as torch.cuda.get_device_properties reports it: 81,559 MiB = 79.65 GiB (the smaller of the two
GPUs this project borrows; the H200 has 139 GiB)."""
ASSUMED_MFU = {"bf16": 0.30, "off": 0.15, "compile": 0.40}
"""MFU the estimate assumes: bf16 autocast eager, autocast off (fp32 with TF32 matmuls), bf16 compiled."""
INIT_PARAMS_PER_S = 50e6
"""Parameters per second that build_hf_model initialises on the CPU before the model moves to the GPU: 55 M/s
measured here for the 468 M-parameter 500M_config_6x4 model (8.5 s, one thread), 122 M/s for the 83 M 124M one."""
RUN_SETUP_S = 3.0
"""Per simulator run: run directory and logs, the trainer, the copy of the model to the GPU, CUDA warm-up."""
DATA_PREP_S = 10.0
"""One token cache of the Shakespeare corpus built for the first time (BPE training and tokenizing): 3–5 s
measured here on one core for vocabularies of 4,096 and 32,000."""
ITERATION_OVERHEAD_S = 0.03
"""Per iteration, beyond the FLOPs: Python and kernel launches of 4 microbatches × 5 stages, the one host sync;
what bounds the tiny and small models on a GPU."""
COMPILE_S = 60.0
"""torch.compile (inductor) of one model, the 5 stages of the 124M model or the plain model, on 16 cores: an
assumption, not measured (no GPU yet). Section 6 compiles both; it runs only when its expected time remains."""
CHECK_STARTUP_S = 20.0
"""Before section 1: Python, the torch import, CUDA initialisation, the report's header."""
COMPARE_S = 10.0
"""Section 1's fused vs plain loss comparison: the 124M model built on the CPU (1.7 s), moved to the GPU, and one
microbatch's forward and backward three times (fp32 reference, plain bf16, fused bf16: about 0.1 s each at 15 %
MFU); an allowance, not FLOP-bound."""
RECOVERY_S = 15.0
"""Section 4: 4 recoveries of the tiny model on the CPU and on the GPU (CUDA context warm already); the CPU
smoke of the same section takes about 5 s here."""
SWARM_S = 90.0
"""Section 5: 12 node processes, each initialising CUDA, 20 iterations of swarm_tiny at time scale 0 and one
whole-stage recovery; not FLOP-bound. The CPU smoke of the section (micro model, 4 iterations) takes about 17 s
here."""


@dataclass(frozen=True)
class SimRun:
    """One simulator run of a section: its config, the check's overrides and the options it runs with."""

    name: str
    config: str
    extra: dict = field(default_factory=dict)
    iterations: int = 10
    setting: str = "no_failure"
    autocast: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    fused_loss: str = "auto"
    """``--fused-loss``: "auto" trains on Liger's fused loss where CUDA and liger-kernel are (the GPU machine),
    "off" on the plain loss (the baseline run of section 1)."""
    kw: dict = field(default_factory=dict)
    """Other SimulateOptions fields (e.g. failure_probability)."""

    def autocast_on(self, device: str) -> bool:
        """Whether bf16 autocast is on for this run on ``device`` (checkfree/devices.py's rule)."""
        return self.autocast == "bf16" or (self.autocast == "auto" and device == "cuda")

    def loss_name(self) -> str:
        """How the plan names its loss on the GPU: "fused loss" or "plain loss"."""
        return "plain loss" if self.fused_loss == "off" else "fused loss"


@dataclass(frozen=True)
class Estimate:
    """Expected seconds of one run on an H100 (``compute`` and ``startup``) and its memory there, with the sentence
    saying how they were made."""

    compute_s: float
    startup_s: float
    memory: M.MemoryEstimate
    how: str

    @property
    def seconds(self) -> float:
        return self.compute_s + self.startup_s


def flops_per_token(cfg: Config, vocab: int) -> int:
    """F = 6·N + 12·L·d·T of the model a run of ``cfg`` builds with vocabulary ``vocab``."""
    counts = M.parameter_counts(cfg, vocab)
    return model_flops_per_token(counts.total - counts.embedding, cfg.n_layers, cfg.dmodel, cfg.seq_l)


def estimate_run(run: SimRun, cfg: Config, vocab: int, strategy: str, steps: int | None = None) -> Estimate:
    """The expected seconds and the memory of ``run`` (``cfg``: its resolved config; ``vocab``: the vocabulary its
    token cache has; ``strategy``: the canonical setting) on one H100; ``steps`` replaces the run's iterations
    (training steps outside a simulator run, e.g. the staged vs plain comparison, with no validation)."""
    autocast = run.autocast_on("cuda")
    mode = "compile" if run.compile else ("bf16" if autocast else "off")
    mfu = ASSUMED_MFU[mode]
    f = flops_per_token(cfg, vocab)
    r = 4 / 3 if run.activation_checkpointing else 1.0
    iterations = run.iterations if steps is None else steps
    train = iterations * cfg.tokens_per_iteration * f * r
    val_tokens = 0 if steps is not None else 2 * cfg.validation * cfg.batch_size * cfg.seq_l
    compute = (train + val_tokens * f / 3) / (mfu * H100_PEAK_FLOPS) + iterations * ITERATION_OVERHEAD_S
    params = M.parameter_counts(cfg, vocab).total
    startup = params / INIT_PARAMS_PER_S + RUN_SETUP_S + (COMPILE_S if run.compile else 0.0)
    fused = run.fused_loss != "off"
    mem = M.simulator_estimate(
        cfg, vocab, "cuda", autocast, run.activation_checkpointing, strategy, fused_loss=fused
    )
    how = (
        f"{iterations} it. × {cfg.tokens_per_iteration * f * r / 1e12:,.1f} TFLOP"
        + (" (×4/3 recompute)" if r > 1 else "")
        + (f" + validation {val_tokens:,} tokens" if val_tokens else "")
        + f" at {100 * mfu:.0f} % MFU + {iterations} × {ITERATION_OVERHEAD_S} s = {compute:.1f} s; start-up "
        f"{params / 1e6:,.0f} M params ÷ {INIT_PARAMS_PER_S / 1e6:.0f} M/s + {RUN_SETUP_S:.0f} s"
        + (f" + compile {COMPILE_S:.0f} s" if run.compile else "")
        + f" = {startup:.1f} s"
    )
    return Estimate(compute, startup, mem, how)
