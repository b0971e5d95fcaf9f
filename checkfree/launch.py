"""Setting up one simulator run: run directory, process group, data, stages, strategy and failures.

``run_simulation(SimulateOptions(...))`` is what ``python -m checkfree simulate`` and the launchers
``simulate_training/run.sh`` / ``run_2.sh`` call (under torchrun, one process per DP replica).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from checkfree.config import HUB_DATASET_NAMES, Config, load_config
from checkfree.failures import (
    PAPER_ITERATION_SECONDS,
    StageFailureInjector,
    StageFailureSource,
    load_stage_schedule,
    resolve_failure_probability,
)
from checkfree.metrics import MetricsSink
from checkfree.model import build_hf_model, split_model, stage_parameter_counts
from checkfree.recovery import make_strategy
from checkfree.simulate import RunContext, Trainer

log = logging.getLogger(__name__)

HUB_VOCAB = {"llama2": 32000, "gpt2": 50257}
PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=10)


@dataclass
class SimulateOptions:
    """Everything ``python -m checkfree simulate`` accepts (README: simulator options)."""

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
    iteration_seconds: float = PAPER_ITERATION_SECONDS
    resume_from: Path | None = None
    device: str = "auto"
    cache_dir: Path | None = None
    dry_run: bool = False
    progress: bool = True
    recovery_accounting: bool = True
    """Add weight distances and probe losses to each recovery record (checkfree.recovery_accounting)."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Config-key overrides of other strategies' options (e.g. {"checkpoint_every": 50})."""


def resolve(opts: SimulateOptions) -> tuple[Config, str, float, str]:
    """Config with CLI overrides, canonical strategy name, per-iteration failure probability and its source."""
    overrides = {
        "max_iterations": opts.max_iterations,
        "eval_interval": opts.eval_interval,
        "log_interval": opts.log_interval,
        "checkpoint_interval": opts.checkpoint_interval,
        "seed": opts.seed,
        "grad_norm_mode": opts.grad_norm_mode,
        **opts.extra,
    }
    cfg = load_config(opts.config, overrides)
    strategy = make_strategy(opts.setting, cfg, opts.swaps, seed=cfg.seed)
    p, source = resolve_failure_probability(
        cfg.failure_probabilities, opts.rate, opts.iteration_seconds, opts.failure_probability
    )
    return cfg, strategy.name, p, source


def default_run_dir(opts: SimulateOptions, cfg: Config, strategy: str) -> Path:
    """``runs/<config>-<strategy>-p<P>-w<W>-seed<S>``; a fresh run never reuses a directory with metrics."""
    rate = f"{opts.rate:g}"
    base = opts.runs_root / f"{Path(opts.config).stem}-{strategy}-p{rate}-w{opts.world_size}-seed{cfg.seed}"
    if opts.start_iter > 0:
        return base
    candidate, n = base, 1
    while (candidate / "metrics.jsonl").exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def failure_source(opts: SimulateOptions, cfg: Config, probability: float) -> StageFailureSource:
    if opts.failure_schedule is not None:
        return load_stage_schedule(opts.failure_schedule, cfg.n_stages, opts.schedule_replicas)
    seed = cfg.seed if opts.failure_seed is None else opts.failure_seed
    return StageFailureInjector(cfg.n_stages, probability, seed, include_stage0=opts.fail_stage0)


def plan_lines(opts: SimulateOptions) -> list[str]:
    """What a run would do, with each stage's parameter count (the model is built on the meta device)."""
    cfg, strategy, p, source = resolve(opts)
    vocab = HUB_VOCAB.get(cfg.tokenizer_name, cfg.vocab_size)
    with torch.device("meta"):
        stages = split_model(build_hf_model(cfg, vocab, seed=0), cfg)
    counts = stage_parameter_counts(stages)
    lines = [
        f"config {opts.config}: {cfg.architecture} d={cfg.dmodel} heads={cfg.num_heads} "
        f"{cfg.n_stages} stages × {cfg.n_layers_per_stage} layers, seq {cfg.seq_l}, "
        f"batch {cfg.batch_size} × {cfg.mb_count} microbatches, lr {cfg.lr}, dataset {cfg.dataset}",
        f"strategy {strategy} (setting {opts.setting!r}), swaps {'on' if opts.swaps else 'off'}, "
        f"world size {opts.world_size}, failure rate {opts.rate:g} %/h → p_iter {p:.6g} ({source})",
        f"parameters: total {sum(counts):,} (vocabulary {vocab:,})",
    ]
    lines += [f"  stage {i}{' (embedding + head)' if i == 0 else ''}: {c:,}" for i, c in enumerate(counts)]
    return lines


def _init_distributed(opts: SimulateOptions) -> tuple[int, int, Any, torch.device]:
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if env_world != opts.world_size:
        raise ValueError(
            f"WORLD_SIZE is {opts.world_size} but {env_world} processes were started; launch with "
            f"torchrun --nproc_per_node={opts.world_size} (the launchers do)."
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if env_world == 1:
        return 0, 1, None, device
    if not dist.is_initialized():  # an embedding program (or a test) may have made the group already
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=PROCESS_GROUP_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), dist.group.WORLD, device


def _setup_logging(run_dir: Path, rank: int) -> None:
    """Per-rank log file in the run directory; rank 0 also logs to the console (above the progress bar)."""
    root = logging.getLogger("checkfree")
    root.setLevel(logging.INFO)
    fmt = logging.Formatter("%(asctime)s rank%(rank)s %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(run_dir / f"rank{rank}.log")
    fh.setFormatter(fmt)
    fh.addFilter(lambda r: setattr(r, "rank", rank) or True)
    root.addHandler(fh)


def _close_logging() -> None:
    root = logging.getLogger("checkfree")
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(h)
        h.close()


def default_cache_dir() -> Path:
    """Token and tokenizer cache: $CHECKFREE_CACHE, else ~/.cache/checkfree."""
    return Path(os.environ.get("CHECKFREE_CACHE", Path.home() / ".cache" / "checkfree")).resolve()


def data_spec(cfg: Config, world_size: int = 1, cache_dir: Path | None = None):
    """The :class:`checkfree.data.DataSpec` of a config (hub datasets stream just enough tokens for the run)."""
    from checkfree.data import DataSpec

    needed = cfg.tokens_per_iteration * world_size * max(1, cfg.max_iterations)
    return DataSpec(
        dataset=cfg.dataset,
        tokenizer=cfg.tokenizer_name,
        vocab_size=cfg.vocab_size,
        seq_len=cfg.seq_l,
        validation_sequences=cfg.validation * cfg.batch_size,
        max_train_tokens=cfg.max_train_tokens or (needed if cfg.dataset in HUB_DATASET_NAMES else None),
        seed=cfg.data_seed,
        cache_dir=Path(cache_dir or default_cache_dir()).resolve(),
    )


def _prepare_data(cfg: Config, opts: SimulateOptions, rank: int, world: int):
    from checkfree.data import BatchSource, prepare_corpus, validation_batches

    spec = data_spec(cfg, world, opts.cache_dir)
    if rank == 0:
        corpus = prepare_corpus(spec)
    if world > 1:
        dist.barrier()
    if rank != 0:
        corpus = prepare_corpus(spec)
    batches = BatchSource(
        corpus.train, cfg.seq_l, cfg.batch_size, rank=rank, world_size=world, seed=cfg.data_seed
    )
    val = validation_batches(corpus, cfg.batch_size, cfg.validation, cfg.seq_l)
    return corpus, batches, val


def run_simulation(opts: SimulateOptions, argv: list[str] | None = None) -> dict[str, Any]:
    """Run one simulation end to end; returns the summary (rank 0 also writes summary.json)."""
    cfg, strategy_name, p, p_source = resolve(opts)
    owns_group = not dist.is_initialized()
    rank, world, group, device = _init_distributed(opts)
    try:
        run_dir = Path(opts.run_dir or default_run_dir(opts, cfg, strategy_name))
        run_dir.mkdir(parents=True, exist_ok=True)
        _setup_logging(run_dir, rank)
        if rank == 0:
            (run_dir / "config.json").write_text(json.dumps(cfg.to_json(), indent=1))
            cmd = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv))
            with open(run_dir / "command.txt", "a") as f:
                f.write(cmd + "\n")
            (run_dir / "options.json").write_text(json.dumps(dataclasses.asdict(opts), indent=1, default=str))
        log.info("run directory %s", run_dir)
        corpus, batches, val = _prepare_data(cfg, opts, rank, world)
        log.info("data: %s", corpus.describe())
        strategy = make_strategy(opts.setting, cfg, opts.swaps, seed=cfg.seed)
        source = failure_source(opts, cfg, p)
        if (opts.fail_stage0 or _schedule_has_stage0(source)) and not strategy.recovers_stage0:
            raise ValueError(
                f"strategy {strategy.name!r} cannot recover stage 0 (embedding and head); only "
                "checkfree_plus and the checkpoint-based strategies can: drop stage 0 failures."
            )
        log.info(
            "strategy %s, swaps %s, p_iter %.6g from %s, grad_norm_mode %s",
            strategy.name,
            opts.swaps,
            p,
            p_source,
            cfg.grad_norm_mode,
        )
        stages = split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed, corpus.eos_id), cfg)
        progress = None
        if rank == 0 and opts.progress:
            from tqdm import tqdm

            progress = tqdm(
                total=cfg.max_iterations,
                initial=opts.start_iter,
                desc=strategy.name,
                unit="it",
                dynamic_ncols=True,
            )
        sink = MetricsSink(run_dir / "metrics.jsonl" if rank == 0 else None)
        ctx = RunContext(
            sink=sink,
            checkpoint_dir=run_dir / "checkpoints",
            rank=rank,
            world_size=world,
            group=group,
            device=device,
            progress=progress,
            recovery_accounting=opts.recovery_accounting,
        )
        trainer = Trainer(cfg, stages, batches, val, strategy, source, ctx, swaps=opts.swaps)
        resume = opts.resume_from or (
            run_dir / "checkpoints" / f"iter_{opts.start_iter:07d}" if opts.start_iter > 0 else None
        )
        if resume is not None:
            trainer.resume(Path(resume))
        summary = trainer.train()
        if progress is not None:
            progress.close()
        summary.update(
            {
                "strategy": strategy.name,
                "setting": opts.setting,
                "swaps": opts.swaps,
                "failure_rate_per_hour": opts.rate,
                "failure_probability": p,
                "failure_probability_source": p_source,
                "grad_norm_mode": cfg.grad_norm_mode,
                "world_size": world,
                "config": opts.config,
                "run_dir": str(run_dir),
                "tokenizer_dir": str(corpus.tokenizer_dir),
                "vocab_size": corpus.vocab_size,
            }
        )
        if rank == 0:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        sink.close()
        return summary
    finally:
        _close_logging()
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _schedule_has_stage0(source: StageFailureSource) -> bool:
    return any(stage == 0 for _, stage in getattr(source, "all", list)())
