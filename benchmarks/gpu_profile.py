"""Where a plain transformers training step spends its device time, and how MFU moves with the model's width.

gpu_check (2026-11-27, one H100) measured the 124M config (d = 512, 12 LLaMa layers, vocabulary 32000, 83.1 M
parameters) at 13.4 % MFU in eager mode and 23.6 % with ``--compile``, checkfree's staged step and a plain
transformers step alike (staged ÷ plain 1.005 / 1.035). This script asks why, on the same step as gpu_check's
plain loop (bf16 autocast, fp32 master weights, Adam, clipping, ``mb_count`` microbatches of random tokens):

1. tokens/s and MFU of the step at several widths (``--widths``, eager; ``--compile-widths``, with
   ``torch.compile``; heads of 64, everything else the config's), MFU by the formula of
   ``checkfree.telemetry.throughput`` (PaLM, Chowdhery et al. 2022, appendix B); a width the device cannot hold
   gives a row saying "out of memory";
2. a ``torch.profiler`` trace of ``--profile-steps`` eager steps of the config's model, its device kernels summed
   by kind (matrix multiplies, attention, optimizer and clipping, everything else: element-wise and reductions),
   with the device's busy time ÷ the wall time (below 1: the host cannot launch kernels fast enough).

``--fused-loss`` computes the loss of every step as checkfree's fused path does (the model's body, then
Liger-Kernel's fused linear cross-entropy on the final norm's output and the head's weight; checkfree/loss.py):
what the profile shows once the logits are gone (issue 41). It needs CUDA and liger-kernel (one sentence, exit
code 2, otherwise).

Usage: ``python benchmarks/gpu_profile.py [--config 124M_config.json] [--widths 512,768,1024,1536]
[--compile-widths 512,1536] [--fused-loss]``;
``--device cpu --smoke`` runs the same code at micro sizes (what tests/benchmarks/test_gpu_profile.py runs).
Output: a table on stdout and ``--out FILE`` (JSON), nothing else.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from checkfree.config import load_config
from checkfree.devices import autocast_context
from checkfree.loss import LIGER_MODULE, resolve_loss_path
from checkfree.model import build_hf_model
from checkfree.telemetry.throughput import device_peak, model_flops_per_token
from checkfree.training_state import make_adam

KINDS = (  # (kind, substrings of a kernel's name); the first that matches wins
    ("fused loss (Liger)", ("liger", "element_mul_kernel")),
    ("matrix multiply", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "addmm", "linear")),
    ("attention", ("flash", "fmha", "attention", "efficient_attention")),
    ("optimizer and clipping", ("multi_tensor", "adam", "foreach")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "element-wise and reductions"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(
    cfg, vocab: int, device: torch.device, autocast: str, compile: bool = False, fused: bool = False
):
    """One plain training step of ``cfg``'s unsplit model (as gpu_check's plain loop), its flops per token and its
    parameter count. ``compile``: ``torch.compile`` the model first (inductor), as gpu_check's plain model;
    ``fused``: the loss through Liger's fused linear cross-entropy (the body compiled, not the loss)."""
    model = build_hf_model(cfg, vocab, cfg.seed).to(device)
    params = sum(p.numel() for p in model.parameters())
    flops = model_flops_per_token(
        params - model.get_input_embeddings().weight.numel(), cfg.n_layers, cfg.dmodel, cfg.seq_l
    )
    body, head = model.base_model, model.get_output_embeddings()
    liger = importlib.import_module(LIGER_MODULE).LigerFusedLinearCrossEntropyLoss() if fused else None
    if compile:
        (body if fused else model).compile()
    opt = make_adam(model, cfg.lr)
    ctx = autocast_context(device, autocast)
    gen = torch.Generator().manual_seed(0)
    batches = [
        torch.randint(vocab, (cfg.batch_size, cfg.seq_l + 1), generator=gen) for _ in range(cfg.mb_count)
    ]
    batches = [b.to(device) for b in batches]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for batch in batches:
            with ctx:
                if liger is not None:
                    h = body(input_ids=batch[:, :-1]).last_hidden_state  # (B, T, d), normalised
                    loss = liger(head.weight, h.reshape(-1, h.shape[-1]), batch[:, 1:].reshape(-1), head.bias)
                else:
                    logits = model(input_ids=batch[:, :-1]).logits
                    loss = F.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))
            (loss / cfg.mb_count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()

    return step, flops, params


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def timed(step, device: torch.device, steps: int) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - t0) / steps


def kernel_table(
    step, device: torch.device, steps: int
) -> tuple[dict[str, float], float, list[tuple[str, float]]]:
    """Device seconds per kernel kind over ``steps`` profiled steps, busy ÷ wall, and the top 8 kernels."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall = time.perf_counter() - t0
    per_kind: dict[str, float] = defaultdict(float)
    per_kernel: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if device.type == "cuda":
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            seconds = ev.device_time_total / 1e6
        else:  # a CPU has no kernels: the aten ops at the top of the call tree stand for them
            if ev.cpu_parent is not None or not ev.name.startswith("aten::"):
                continue
            seconds = ev.cpu_time_total / 1e6
        per_kind[kind_of(ev.name)] += seconds
        per_kernel[ev.name[:70]] += seconds
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]
    return dict(per_kind), sum(per_kind.values()) / wall, top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="124M_config.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--autocast", default="bf16", choices=["bf16", "off"])
    ap.add_argument("--widths", default="512,768,1024,1536", help="d_model values of the sweep (heads of 64)")
    ap.add_argument("--compile-widths", default="", help="d_model values timed again with torch.compile")
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per width, after 2 warm-up steps")
    ap.add_argument("--smoke", action="store_true", help="micro sizes (a CPU check of the code)")
    ap.add_argument("--out", type=Path, help="JSON file for the numbers")
    ap.add_argument(
        "--fused-loss", action="store_true", help="the loss through Liger's fused linear cross-entropy (CUDA)"
    )
    args = ap.parse_args(argv)
    try:
        widths = [int(w) for w in args.widths.split(",")]
        compile_widths = [int(w) for w in args.compile_widths.split(",") if w]
    except ValueError:
        print(
            f"error: --widths {args.widths!r} or --compile-widths {args.compile_widths!r} is not a comma-separated "
            "list of integers",
            file=sys.stderr,
        )
        return 2
    if any(w <= 0 or w % 64 for w in widths + compile_widths):
        print(
            f"error: --widths {args.widths!r} / --compile-widths {args.compile_widths!r}: every width must be a "
            "positive multiple of 64",
            file=sys.stderr,
        )
        return 2
    if not args.smoke and not args.device.startswith("cuda"):
        print(
            f"error: --device {args.device} at full size: the sweep is for a CUDA device (--smoke: micro sizes)",
            file=sys.stderr,
        )
        return 2
    if args.fused_loss:
        try:
            resolve_loss_path("on", torch.device(args.device).type)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.out is not None and args.out.exists():
        print(f"error: --out {args.out} exists; give a new file", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    small = {"batch_size": 2, "seq_l": 32, "n_layers_per_stage": 1} if args.smoke else {}
    cfg = load_config(args.config, small)
    vocab = 512 if args.smoke else 32000
    peak = device_peak(device)
    print(
        f"device {device} ({peak.source}); {args.config}: d {cfg.dmodel}, {cfg.n_layers} layers, vocabulary {vocab}, "
        f"{cfg.mb_count} × {cfg.batch_size} × {cfg.seq_l} tokens per step, autocast {args.autocast}, "
        f"{'fused' if args.fused_loss else 'plain'} loss",
        flush=True,
    )

    sweep = []
    print("\nwidth sweep (same layers, tokens and vocabulary; heads of 64):")
    print("  d_model | compiled | params (M) | tokens/s | MFU", flush=True)
    runs = [(w, False) for w in widths] + [(w, True) for w in compile_widths]
    for width, compiled in runs:
        wcfg = load_config(args.config, {**small, "dmodel": width, "num_heads": width // 64})
        row = {"d_model": width, "compiled": compiled}
        try:
            step, fpt, params = make_step(wcfg, vocab, device, args.autocast, compiled, args.fused_loss)
            timed(step, device, 2)  # warm-up (and compilation)
            seconds = timed(step, device, args.steps)
        except (
            torch.cuda.OutOfMemoryError
        ):  # a width the device cannot hold: a row saying so, the sweep goes on
            step = None
            sweep.append({**row, "error": "out of memory"})
            print(f"  {width:7d} | {'yes' if compiled else 'no':8s} | out of memory", flush=True)
            free(device)
            continue
        tps = wcfg.mb_count * wcfg.batch_size * wcfg.seq_l / seconds
        mfu = fpt * tps / peak.flops if peak.flops else None
        sweep.append({**row, "params": params, "tokens_per_second": round(tps, 1), "mfu": mfu})
        mfu_text = f"{mfu:.1%}" if mfu is not None else "n/a"
        print(
            f"  {width:7d} | {'yes' if compiled else 'no':8s} | {params / 1e6:10.1f} | {tps:8,.0f} | {mfu_text}",
            flush=True,
        )
        del step
        free(device)

    step, _, _ = make_step(cfg, vocab, device, args.autocast, fused=args.fused_loss)
    timed(step, device, 2)  # warm-up
    per_kind, busy, top = kernel_table(step, device, args.profile_steps)
    total = sum(per_kind.values())
    print(f"\nprofile of {args.profile_steps} eager steps at d {cfg.dmodel}: device busy ÷ wall {busy:.2f}")
    if not per_kind:
        print("  the profiler recorded no kernels")
    for kind, seconds in sorted(per_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:30s} {seconds / args.profile_steps * 1e3:9.1f} ms/step  {seconds / total:6.1%}")
    print("  top kernels:")
    for name, seconds in top:
        print(f"    {seconds / args.profile_steps * 1e3:8.1f} ms/step  {name}")

    if args.out is not None:
        result = {
            "device": str(device),
            "peak": peak.source,
            "config": args.config,
            "autocast": args.autocast,
            "fused_loss": args.fused_loss,
            "busy_over_wall": busy,
            "ms_per_step_by_kind": {k: v / args.profile_steps * 1e3 for k, v in per_kind.items()},
            "top_kernels_ms_per_step": [[n, s / args.profile_steps * 1e3] for n, s in top],
            "sweep": sweep,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
