"""The simulator on CUDA: throughput, MFU, compile, convergence under failures, recovery CUDA vs CPU (issue 12).

    benchmarks/gpu_check.sh                      # on a CUDA machine; prints one table
    SMOKE=1 DEVICE=cpu benchmarks/gpu_check.sh   # every section's logic on the CPU, micro sizes, in a minute

Sections, each with its time budget on one H100 (19 min in all; its time is printed and recorded beside it):
  1. 124M config on the default corpus (Shakespeare, BPE 4096), W = 1, 30 iterations, no failures: tokens/s, MFU,
     peak GPU memory, and staged step ÷ plain transformers step on the same batches (GPU twin of bench_staged.py:
     10 warm-up iterations of each, then 3 interleaved rounds of 10). Targets on an H100: MFU ≥ 35 %, staged ÷
     plain ≤ 1.05. Budget 4 min: the corpus's tokenizer and cache are built here (≈ 1 min); the ≈ 110 timed
     iterations (4 microbatches × 64 × 512 tokens, ≈ 35 TFLOP each) take ≈ 0.1 s each at 35 % MFU.
  2. the same with --compile (torch.compile of each stage; the plain model compiled too). Budget 7 min: the
     compilations.
  3. tiny and small configs, 200 iterations, failures at 16 %/h under checkfree_plus: finish, loss finite and
     falls. Budget 2.5 min.
  4. CheckFree / CheckFree+ recovery on CUDA tensors vs the same on CPU: same plans, max |diff| of the weights.
     Budget 30 s.
  5. the swarm (configs/swarm_tiny.json, setting ours, --time-scale 0: compute, real transfers and recovery, no
     emulated WAN) on --device DEVICE with one whole-stage crash (both replicas of stage 2, mid-run): mean
     iteration time with and without the crash, crash → serving seconds, every crash recovered, every node on
     the device (throughput.json's node_devices). SMOKE: synthetic batches, 4 iterations. Budget 5 min (12 node
     processes start, each with its own CUDA context); the swarm is stopped after 10 min.

Every row is printed as soon as it is measured and appended to OUT_DIR/gpu_check.md, and OUT_DIR/gpu_check.json
(strict JSON: every row, each section's seconds and budget, the status) is rewritten at each row, so a run cut
short keeps what it measured. OUT_DIR (--out-dir, or the OUT_DIR environment variable) defaults to
runs/gpu_check-<UTC time> in the repository; a directory that already holds gpu_check.json or gpu_check.md is
refused (exit code 2, nothing written). Each section's models are freed (gc, torch.cuda.empty_cache) and the peak
memory statistics reset before the next section measures. A section that raises is reported (its traceback
printed, an "error" row recorded) and the next one runs: one broken section must not cost the device time of
the others; the exit code is then 1. The runs themselves go to a temporary directory (kept, its path printed).
"""

from __future__ import annotations

import os

# Before torch is imported and anything forks (datasets' map, the swarm's nodes): torch.cuda.is_available() then
# asks NVML instead of initialising CUDA in this process, which forked children could not use.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import argparse  # noqa: E402
import copy  # noqa: E402
import datetime  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from checkfree.config import load_config  # noqa: E402
from checkfree.data.batches import BatchSource  # noqa: E402
from checkfree.data.corpus import prepare_corpus  # noqa: E402
from checkfree.devices import autocast_context, to_device  # noqa: E402
from checkfree.failures.injection import StageFailureInjector  # noqa: E402
from checkfree.model import build_hf_model, build_stages, split_model  # noqa: E402
from checkfree.recovery.registry import make_strategy  # noqa: E402
from checkfree.sim.launch import SimulateOptions, data_spec, run_simulation  # noqa: E402
from checkfree.sim.trainer import RunContext, Trainer  # noqa: E402
from checkfree.telemetry.metrics import MetricsSink  # noqa: E402
from checkfree.training_state import TrainingState, make_adam  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPORT_FILES = ("gpu_check.md", "gpu_check.json")
SWARM_TIMEOUT_S = 600
ROWS: list[tuple[str, str, str]] = []
MICRO = {"architecture": "LLaMa", "validation": 2, "dmodel": 32, "num_heads": 2, "n_layers_per_stage": 1}
MICRO |= {"n_stages": 4, "seq_l": 16, "batch_size": 2, "mb_count": 2, "lr_scale": 1.1, "lr": 3e-3}
MICRO |= {"eval_interval": 3, "log_interval": 3, "checkpoint_interval": 0, "vocab_size": 300, "16": 0.3}
WORDS = "the king queen sword crown night day love death fool ghost castle storm sea letter ring".split()


class Report:
    """OUT_DIR/gpu_check.md and OUT_DIR/gpu_check.json, brought up to date at every row.

    The Markdown file is appended to (a header, then one table line per row, then the verdict); the JSON file is
    rewritten whole through a temporary file and a rename, so a reader never sees half of it. It is strict JSON
    (``allow_nan=False``; a non-finite number, which no field holds today, would be written as null).
    """

    def __init__(self, out_dir: Path, header: dict[str, object]):
        self.out_dir = out_dir
        self.md = out_dir / "gpu_check.md"
        self.data: dict[str, object] = {
            "format": "checkfree-gpu-check-v1",
            "status": "running",
            **header,
            "updated": header["started"],
            "sections": [],
            "rows": [],
        }
        out_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"# gpu_check, {header['started']}", ""]
        lines += [f"- {k}: {v}" for k, v in header.items() if k != "started"]
        lines += ["", "| section | metric | value |", "|---|---|---|"]
        self.md.write_text("\n".join(lines) + "\n")
        self._write_json()

    def row(self, section: str, metric: str, value: str) -> None:
        self.data["rows"].append({"section": section, "metric": metric, "value": value})
        cells = (c.replace("|", "\\|") for c in (section, metric, value))
        with open(self.md, "a") as f:
            f.write("| " + " | ".join(cells) + " |\n")
        self._write_json()

    def section(
        self, number: int, title: str, budget_s: float | None, seconds: float, ok: bool | None
    ) -> None:
        self.data["sections"].append(
            {"number": number, "title": title, "budget_s": budget_s, "seconds": round(seconds, 1), "ok": ok}
        )
        self._write_json()

    def finish(self, status: str, verdict: str) -> None:
        self.data["status"] = status
        with open(self.md, "a") as f:
            f.write(f"\n{verdict}\n")
        self._write_json()

    def _write_json(self) -> None:
        self.data["updated"] = _now()
        tmp = self.out_dir / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(_finite(self.data), indent=1, allow_nan=False) + "\n")
        os.replace(tmp, self.out_dir / "gpu_check.json")


def _finite(obj: object) -> object:
    """``obj`` with every non-finite float as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


REPORT: Report | None = None


def row(section: str, metric: str, value: str) -> None:
    """Print one measured row now, keep it for the closing table, and write it to OUT_DIR's two files."""
    ROWS.append((section, metric, value))
    print(f"  {section:<34} {metric:<30} {value}", flush=True)
    if REPORT is not None:
        REPORT.row(section, metric, value)


def free_memory(device: torch.device) -> None:
    """Drop what the last section left (its models, optimizers, compiled graphs) before the next one measures:
    a garbage collection, the caching allocator's free blocks back to the driver, the peak statistics reset."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def smoke_setup(root: Path) -> str:
    """A micro config on a generated 24-document corpus (SMOKE=1)."""
    rng = np.random.default_rng(0)
    (root / "corpus").mkdir(parents=True)
    for f in range(24):
        lines = [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), 10)) + "." for _ in range(30)]
        (root / "corpus" / f"doc_{f:02d}.txt").write_text("\n".join(lines) + "\n")
    path = root / "micro_config.json"
    path.write_text(json.dumps({**MICRO, "dataset": str(root / "corpus"), "max_iterations": 4}))
    return str(path)


def simulate(args: argparse.Namespace, name: str, config: str, setting: str, iterations: int, **kw) -> dict:
    opts = SimulateOptions(
        setting=setting,
        config=config,
        swaps=setting == "checkfree_plus",
        run_dir=args.root / "runs" / name,
        max_iterations=iterations,
        eval_interval=kw.pop("eval_interval", iterations),
        checkpoint_interval=0,
        device=args.device,
        cache_dir=args.cache_dir,
        progress=False,
        extra=kw.pop("extra", {}),
        **kw,
    )
    return run_simulation(opts, argv=["gpu_check", name])


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: a host-device sync, so that the timers see finished work


def staged_vs_plain(args: argparse.Namespace, config: str, extra: dict, compile_backend: str | None) -> float:
    """Median time of checkfree's staged Trainer step ÷ a plain transformers step, same batches, same autocast."""
    cfg = load_config(config, extra)
    device = torch.device(args.device)
    corpus = prepare_corpus(data_spec(cfg, 1, args.cache_dir))
    batches = BatchSource(corpus.train, cfg.seq_l, cfg.batch_size, seed=cfg.data_seed)
    ctx = RunContext(sink=MetricsSink(None), device=device)
    ctx.compile, ctx.compile_backend = compile_backend is not None, compile_backend or "inductor"
    stages = split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed), cfg)
    trainer = Trainer(
        cfg,
        stages,
        batches,
        [],
        make_strategy("no_failure", cfg, False),
        StageFailureInjector(cfg.n_stages, 0.0, 0),
        ctx,
        False,
    )
    model = build_hf_model(cfg, corpus.vocab_size, cfg.seed).to(device)
    if compile_backend is not None:
        model.compile(backend=compile_backend)
    opt = make_adam(model, cfg.lr)
    autocast = autocast_context(device, "auto")
    step = [0]

    def plain_step() -> None:
        opt.zero_grad(set_to_none=True)
        for mb in range(cfg.mb_count):
            batch = to_device(batches.batch(step[0] * cfg.mb_count + mb), device)
            with autocast:
                logits = model(input_ids=batch[:, :-1]).logits
                loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
            (loss / cfg.mb_count).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step[0] += 1

    def timed(fn) -> float:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.iterations):
            fn()
        sync(device)
        return (time.perf_counter() - t0) / args.iterations

    timed(trainer.step), timed(plain_step)  # warm-up (and compilation)
    staged, plain = [], []
    for _ in range(args.rounds):
        staged.append(timed(trainer.step))
        plain.append(timed(plain_step))
    # trainer, stages, model and opt go with this frame; the caller's free_memory() collects any cycles among them
    return statistics.median(staged) / statistics.median(plain)


def throughput_section(args: argparse.Namespace, title: str, config: str, extra: dict, compile: bool) -> None:
    backend = ("eager" if args.device == "cpu" else "inductor") if compile else None
    s = simulate(
        args,
        title.replace(" ", "_").replace("=", "").replace("--", ""),
        config,
        "no_failure",
        args.big_iterations,
        extra=extra,
        compile=compile,
        compile_backend=backend or "inductor",
    )
    row(title, "tokens/s (mean, it. 2..N)", f"{s['tokens_per_second']:,.0f}")
    mfu = s["mfu"]
    row(title, "MFU", "n/a" if mfu is None else f"{100 * mfu:.1f} %  (peak: {s['peak_flops_source']})")
    row(title, "peak memory", f"{s['peak_memory_bytes'] / 2**30:.2f} GiB ({s['peak_memory_source']})")
    free_memory(torch.device(args.device))
    ratio = staged_vs_plain(args, config, extra, backend)
    if compile:
        torch._dynamo.reset()  # the compiled graphs and their buffers go with the section
    row(title, "staged ÷ plain step", f"{ratio:.3f}")
    if args.device == "cuda" and not compile:
        met = mfu is not None and mfu >= 0.35 and ratio <= 1.05
        row(title, "target MFU ≥ 35 %, ratio ≤ 1.05", "met" if met else "missed")


def convergence_section(args: argparse.Namespace, name: str, config: str, iterations: int, **kw) -> bool:
    s = simulate(args, f"converge_{name}", config, "checkfree_plus", iterations, **kw)
    first, final = s["first_eval"]["val_loss"], s["final_eval"]["val_loss"]
    ok = s["effective_iterations"] == iterations and math.isfinite(s["final_train_loss"]) and final < first
    row(
        f"{name}: {iterations} it., checkfree_plus",
        "failures / recoveries",
        f"{s['failures']} / {s['recoveries']}",
    )
    row(f"{name}: {iterations} it., checkfree_plus", "val loss first → final", f"{first:.3f} → {final:.3f}")
    row(f"{name}: {iterations} it., checkfree_plus", "finished, finite, falling", "yes" if ok else "NO")
    return ok


def recovery_section(args: argparse.Namespace) -> bool:
    """The same loss event recovered on CPU and on the device: identical plans, fp32 weights within 1e-5."""
    cfg = load_config("tiny_config.json")
    base = build_stages(cfg, 512, seed=3)
    norms = [0.7, 1.3, 0.4, 2.1, 0.9]
    ok = True
    for setting, failed in [
        ("checkfree", [2]),
        ("checkfree_plus", [1]),
        ("checkfree_plus", [4]),
        ("average", [3]),
    ]:
        results = []
        for device in (torch.device("cpu"), torch.device(args.device)):
            stages = [copy.deepcopy(s).to(device) for s in base]
            state = TrainingState(stages, [make_adam(s, cfg.lr) for s in stages], base_lr=cfg.lr)
            state.grad_norms = list(norms)
            strategy = make_strategy(setting, cfg, swaps=setting == "checkfree_plus", seed=0)
            strategy.bind(RunContext(sink=MetricsSink(None), device=device))
            strategy.setup(state)
            for s in failed:
                state.destroy(s)
            plans = [(r.stage, r.rule, tuple(r.sources)) for r in strategy.recover(state, list(failed))]
            results.append(
                (plans, {k: v.float().cpu() for s in failed for k, v in state.stage_state(s).items()})
            )
        (cpu_plans, cpu_w), (dev_plans, dev_w) = results
        diff = max(float((cpu_w[k] - dev_w[k]).abs().max()) for k in cpu_w)
        same = cpu_plans == dev_plans and diff <= 1e-5
        ok &= same
        row(
            f"recovery {setting} stage {failed[0]}",
            f"{args.device} vs cpu max |diff|",
            f"{diff:.2e}" + ("" if cpu_plans == dev_plans else "  PLANS DIFFER"),
        )
    return ok


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def swarm_section(args: argparse.Namespace) -> bool:
    """``swarm run`` of swarm_tiny on the device, both replicas of stage 2 killed at the middle iteration."""
    iterations = 4 if args.smoke else 20
    crash = iterations // 2
    schedule = args.root / "swarm_schedule.json"
    schedule.write_text(json.dumps({"4": [crash, iterations + 1], "5": [crash, iterations + 1]}))
    run_dir = args.root / "runs" / "swarm"
    cmd = [sys.executable, "-m", "checkfree", "swarm", "run", "--setting", "ours"]
    cmd += [
        "--config",
        "swarm_tiny.json",
        "--device",
        args.device,
        "--schedule",
        str(schedule),
        "--iterations",
        str(iterations),
    ]
    cmd += ["--time-scale", "0", "--run-dir", str(run_dir)]
    if args.cache_dir is not None:
        cmd += ["--cache-dir", str(args.cache_dir)]
    if args.smoke:  # the micro model on synthetic batches: the same code path in seconds
        micro = json.dumps(str(args.root / "micro_config.json"))
        cmd += ["--data", "synthetic", "--set", f"model_config={micro}"]
    root = Path(__file__).resolve().parents[1]
    title = f"swarm {'micro' if args.smoke else 'tiny'}: ours, stage 2 lost at it. {crash}"
    with open(args.root / "swarm.log", "w") as log:
        try:
            code = subprocess.run(
                cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, timeout=SWARM_TIMEOUT_S
            ).returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {SWARM_TIMEOUT_S} s"
    if code != 0:
        row(title, "swarm run", f"FAILED (exit {code}; {args.root / 'swarm.log'})")
        return False
    r = json.loads((run_dir / "throughput.json").read_text())
    devices = sorted(set(r["node_devices"].values()))
    row(title, "node devices", ", ".join(devices) + f" ({len(r['node_devices'])} nodes)")
    row(
        title,
        "mean iteration s (w/o crash)",
        f"{_num(r['mean_iteration_s'])} ({_num(r['mean_iteration_s_without_crashes'])})",
    )
    row(title, "crash → serving s", _num(r["mean_crash_to_serving_s"], 2))
    losses = [loss for _, loss in r["loss_curve"]]
    ok = (
        r["iterations_completed"] == iterations
        and r["crashes_count"] == 2
        and r["recovered_count"] == 2
        and all(d.split(":")[0] == args.device for d in devices)
        and all(math.isfinite(x) for x in losses)
    )
    row(
        title,
        "crashes recovered, loss finite",
        f"{r['recovered_count']}/{r['crashes_count']}, " + ("yes" if ok else "NO"),
    )
    return ok


SECTIONS: list[tuple[str, float]] = [
    ("throughput, no failures", 240),
    ("the same with --compile", 420),
    ("convergence under failures", 150),
    ("recovery on the device vs CPU", 30),
    ("swarm on the device", 300),
]
"""Each section's title and its time budget in seconds on one H100 (the module docstring says what fills it)."""


def out_dir_for(value: str | None) -> Path:
    """OUT_DIR: the given directory, or runs/gpu_check-<UTC time> in the repository. Raises ValueError (one
    sentence) for a file, or for a directory that already holds gpu_check.md or gpu_check.json."""
    if not value:
        return ROOT / "runs" / f"gpu_check-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"OUT_DIR {out} is a file; expected a directory for gpu_check.md and gpu_check.json."
        )
    taken = [f for f in REPORT_FILES if (out / f).exists()]
    if taken:
        raise ValueError(f"OUT_DIR {out} already holds {taken[0]}; expected a new or empty directory.")
    return out


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--smoke", action="store_true", help="micro config, a few iterations (runs on a CPU)")
    ap.add_argument(
        "--cache-dir", type=Path, help="token cache (default $CHECKFREE_CACHE or ~/.cache/checkfree)"
    )
    ap.add_argument("--iterations", type=int, default=10, help="iterations per timed block (staged vs plain)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timed blocks of each loop")
    ap.add_argument(
        "--out-dir",
        default=os.environ.get("OUT_DIR"),
        help="where gpu_check.md and gpu_check.json go (default $OUT_DIR, else runs/gpu_check-<UTC time>)",
    )
    args = ap.parse_args()
    try:
        out_dir = out_dir_for(args.out_dir)
    except ValueError as e:
        print(f"gpu_check: {e}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    args.root = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    global REPORT
    REPORT = Report(
        out_dir,
        {
            "started": _now(),
            "device": args.device,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "smoke": args.smoke,
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "scratch_dir": str(args.root),
        },
    )
    print(
        f"gpu_check on {args.device} (smoke {args.smoke}); runs in {args.root}; report in {out_dir}",
        flush=True,
    )
    if args.smoke:
        args.cache_dir = args.cache_dir or args.root / "cache"
        args.iterations, args.rounds, args.big_iterations = 1, 1, 2
        big, big_extra = smoke_setup(args.root), {}
        small = [("micro", big, 4, {"failure_probability": 0.3})]
    else:
        args.big_iterations = 30
        big, big_extra = "124M_config.json", {"dataset": "Shakespeare", "tokenizer": "bpe"}
        small = [("tiny", "tiny_config.json", 200, {}), ("small", "small_config.json", 200, {})]
    big_name = "micro" if args.smoke else "124M"

    def convergence() -> bool:
        ok = True
        for name, config, iterations, kw in small:
            ok &= convergence_section(args, name, config, iterations, **kw)
        return ok

    runs: list[Callable[[], bool | None]] = [
        lambda: throughput_section(args, f"{big_name} W=1", big, big_extra, compile=False),
        lambda: throughput_section(args, f"{big_name} W=1 --compile", big, big_extra, True),
        convergence,
        lambda: recovery_section(args),
        lambda: swarm_section(args),
    ]
    signal.signal(signal.SIGTERM, _interrupted)
    ok, t_all = True, time.perf_counter()
    try:
        for number, ((title, budget), run) in enumerate(zip(SECTIONS, runs, strict=True), start=1):
            print(f"{number}. {title}", flush=True)
            t0, passed = time.perf_counter(), None
            try:
                passed = run()
            except Exception as e:  # a broken section is reported; the others still get their device time
                traceback.print_exc()
                row(
                    f"{number}. {title}",
                    "error",
                    f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}",
                )
                passed = False
            seconds = time.perf_counter() - t0
            ok &= passed is not False
            budget_s = None if args.smoke else budget
            within = "" if budget_s is None else f" of {budget} s budgeted on an H100"
            row(f"{number}. {title}", "section seconds", f"{seconds:.1f}{within}")
            REPORT.section(number, title, budget_s, seconds, passed)
            free_memory(device)
    except KeyboardInterrupt:
        REPORT.finish("interrupted", "INTERRUPTED: the rows above are what was measured")
        print(f"\ninterrupted; what was measured is in {out_dir}", file=sys.stderr)
        return 130
    row("all sections", "seconds", f"{time.perf_counter() - t_all:.1f}")
    width = max(len(r[0]) for r in ROWS)
    print(f"\n{'section':<{width}} | {'metric':<30} | value")
    print(f"{'-' * width}-|-{'-' * 30}-|-{'-' * 20}")
    for section, metric, value in ROWS:
        print(f"{section:<{width}} | {metric:<30} | {value}")
    verdict = "all checks passed" if ok else "SOME CHECKS FAILED"
    REPORT.finish("passed" if ok else "failed", verdict)
    print(f"\nreport: {out_dir / 'gpu_check.md'}, {out_dir / 'gpu_check.json'}")
    print(f"\n{verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
