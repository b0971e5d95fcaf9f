"""Setting up one simulator run: run directory, process group, data, stages, strategy and failures.

``run_simulation(SimulateOptions(...))`` is what ``python -m checkfree simulate`` and the launchers
``simulate_training/run.sh`` / ``run_2.sh`` call (under torchrun, one process per DP replica).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from checkfree import PACKAGE_LOG, jsonio
from checkfree.config import HUB_DATASET_NAMES, Config
from checkfree.failures.injection import StageFailureSource, StageSchedule
from checkfree.memory import model_vocab_size
from checkfree.model import build_hf_model, split_model, stage_parameter_counts
from checkfree.rundir import RunDirPlan, apply_run_dir
from checkfree.sim.options import SimulateOptions
from checkfree.sim.preflight import preflight
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink
from checkfree.telemetry.monitoring import TENSORBOARD_DIR, TensorBoardMirror, progress_bar
from checkfree.telemetry.throughput import device_peak

log = logging.getLogger(__name__)
T = TypeVar("T")

PROCESS_GROUP_TIMEOUT = datetime.timedelta(minutes=10)
DATA_PREP_TIMEOUT = datetime.timedelta(hours=24)
"""How long ranks 1..W−1 wait for rank 0 to prepare the token cache (:func:`rank0_first`). Preparing a hub
dataset's budget can take hours, far more than PROCESS_GROUP_TIMEOUT; if rank 0 dies instead, torchrun stops the
other ranks, so a long wait cannot hang a run."""
WAIT_LOG_SECONDS = 60.0
"""A waiting rank logs one progress line this often."""


def plan_lines(opts: SimulateOptions) -> list[str]:
    """What a run would do, with each stage's parameter count (the model is built on the meta device).

    Runs every check of a real run (:func:`checkfree.sim.preflight.preflight`) and, like it, writes nothing.
    """
    pre = preflight(opts)
    cfg, strategy, p, source = pre.cfg, pre.strategy, pre.probability, pre.probability_source
    vocab = model_vocab_size(cfg)
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
    moved = f"; the run there now moves to {pre.run_dir.move_to}" if pre.run_dir.move_to else ""
    resume = f", resuming {pre.resume}" if pre.resume else ""
    lines.append(f"run directory {pre.run_dir.path}{resume}{moved}")
    lines += [f"warning: {w}" for w in pre.warnings]
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
        # fp32 matmuls (autocast off, or ops autocast keeps in fp32) may use TF32 tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if env_world == 1:
        return 0, 1, None, device
    if not dist.is_initialized():  # an embedding program (or a test) may have made the group already
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=PROCESS_GROUP_TIMEOUT)
    return dist.get_rank(), dist.get_world_size(), dist.group.WORLD, device


def _setup_logging(run_dir: Path, rank: int) -> None:
    """Per-rank log file in the run directory; rank 0 also logs to the console (above the progress bar)."""
    root = PACKAGE_LOG
    root.setLevel(logging.INFO)
    fmt = logging.Formatter("%(asctime)s rank%(rank)s %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(run_dir / f"rank{rank}.log")
    fh.setFormatter(fmt)
    fh.addFilter(lambda r: setattr(r, "rank", rank) or True)
    root.addHandler(fh)


def _close_logging() -> None:
    root = PACKAGE_LOG
    for h in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(h)
        h.close()


def data_spec(cfg: Config, world_size: int = 1, cache_dir: Path | None = None):
    """The :class:`checkfree.data.spec.DataSpec` of a config. A hub dataset streams and caches the run's token budget
    (``train_token_budget``: max_iterations × tokens per iteration × W); a local corpus is cached whole. The
    config's ``max_train_tokens`` (``--max-train-tokens``) caps either."""
    from checkfree.data.batches import train_token_budget
    from checkfree.data.spec import DataSpec

    budget = train_token_budget(cfg.max_iterations, cfg.mb_count, cfg.batch_size, cfg.seq_l, world_size)
    wanted = budget if cfg.dataset in HUB_DATASET_NAMES else None
    if cfg.max_train_tokens is not None:
        wanted = min(wanted or cfg.max_train_tokens, cfg.max_train_tokens)
    resolved = Path(cache_dir).resolve() if cache_dir else None
    return DataSpec.from_config(cfg, max_train_tokens=wanted, cache_dir=resolved)


def data_budget_line(cfg: Config, world_size: int, stream_tokens: int) -> tuple[str, float]:
    """One log line: the run's training-token budget and how many epochs of the cached stream that is."""
    from checkfree.data.batches import epochs, train_token_budget

    budget = train_token_budget(cfg.max_iterations, cfg.mb_count, cfg.batch_size, cfg.seq_l, world_size)
    n = epochs(budget, stream_tokens, cfg.seq_l)
    line = (
        f"token budget {budget:,} = {cfg.max_iterations} iterations × {cfg.mb_count} microbatches × "
        f"{cfg.batch_size} sequences × W {world_size} × {cfg.seq_l + 1} tokens, over {stream_tokens:,} training "
        f"tokens: {n:.3f} epochs"
    )
    return line, n


def rank0_first(
    work: Callable[[], T],
    rank: int,
    world: int,
    what: str,
    timeout: datetime.timedelta = DATA_PREP_TIMEOUT,
    log_every: float = WAIT_LOG_SECONDS,
) -> T:
    """Run ``work()`` on rank 0 first, then on every other rank (which then finds what rank 0 made, e.g. the token
    cache); returns its result on every rank. With one rank, just ``work()``.

    The other ranks wait at a barrier of a gloo group of their own, created with ``timeout``: the default group's
    PROCESS_GROUP_TIMEOUT (10 min, NCCL's default too) is shorter than a hub-sized data preparation. While they
    wait they log a progress line every ``log_every`` seconds naming ``what``. Every rank must call this.

    Raises:
        RuntimeError (from torch.distributed): rank 0 did not arrive within ``timeout``.
    """
    if world == 1:
        return work()
    group = dist.new_group(backend="gloo", timeout=timeout)
    try:
        if rank == 0:
            result = work()
            dist.barrier(group=group)
            return result
        t0 = time.monotonic()
        waiting = dist.barrier(group=group, async_op=True)
        next_line = t0 + log_every
        while not waiting.is_completed():
            if time.monotonic() >= next_line:
                log.info(
                    "waiting for rank 0: %s, %.0f min so far (up to %s)",
                    what,
                    (time.monotonic() - t0) / 60,
                    timeout,
                )
                next_line += log_every
            time.sleep(0.2)
        waiting.wait()  # raises if the barrier failed (rank 0 gone, or the timeout)
        return work()
    finally:
        dist.destroy_process_group(group)


def _prepare_data(cfg: Config, opts: SimulateOptions, rank: int, world: int):
    from checkfree.data.batches import BatchSource, validation_batches
    from checkfree.data.corpus import prepare_corpus

    spec = data_spec(cfg, world, opts.cache_dir)
    corpus = rank0_first(
        lambda: prepare_corpus(spec), rank, world, what=f"preparing the token cache of {cfg.dataset}"
    )
    batches = BatchSource(
        corpus.train, cfg.seq_l, cfg.batch_size, rank=rank, world_size=world, seed=cfg.data_seed
    )
    val = validation_batches(corpus, cfg.batch_size, cfg.validation, cfg.seq_l)
    return corpus, batches, val


def _claim_run_dir(plan: RunDirPlan, rank: int, world: int) -> Path:
    """Rank 0 moves an old run aside (--overwrite) and creates the directory; every rank validated it first."""
    if world > 1:
        dist.barrier()  # every rank has decided before any rank changes the disk
    if rank == 0:
        apply_run_dir(plan)
    if world > 1:
        dist.barrier()
    return plan.path


def replica_shortage(source: StageFailureSource, iterations: int) -> dict[str, Any]:
    """For a schedule replayed from a preemption trace (:mod:`checkfree.failures.traces`): per stage, how many of
    the run's first ``iterations`` iterations it ran short of replicas and how many it had none; else nothing.
    """
    if not isinstance(source, StageSchedule) or not (source.short_iterations or source.lost_iterations):
        return {}
    short, lost = source.short_iterations, source.lost_iterations
    count = {s: sum(1 for k in ks if k < iterations) for s, ks in short.items()}
    gone = {s: sum(1 for k in ks if k < iterations) for s, ks in lost.items()}
    return {"short_of_replicas_iterations": count, "all_replicas_down_iterations": gone}


class RunInterrupted(Exception):
    """Ctrl-C (SIGINT) stopped a run; the message is the one sentence saying where and how to resume."""


def _interrupted(trainer: Trainer, run_dir: Path, rank: int, sink: MetricsSink, cause: str = "SIGINT") -> str:
    """After a KeyboardInterrupt in training (Ctrl-C, or SIGTERM through checkfree.cli): keep what was written,
    write summary.json with ``"status": "interrupted"`` and ``cause`` (rank 0), close the metrics, and return the
    sentence naming the checkpoint to resume from."""
    from checkfree.checkpoint.store import list_checkpoints

    st = trainer.state
    found = list_checkpoints(run_dir / "checkpoints")
    if found:
        resume = f"resume with the same command plus --resume-from {found[-1]}"
    else:
        resume = f"no run checkpoint was written yet; start again with --overwrite or another --run-dir than {run_dir}"
    sentence = f"interrupted at iteration {st.iteration} (effective {st.effective_iteration}); {resume}"
    if rank == 0:
        summary = {
            "status": "interrupted",
            "cause": cause,
            "stopped": sentence,
            "iterations": st.iteration,
            "effective_iterations": st.effective_iteration,
            "resume_from": str(found[-1]) if found else None,
            "first_eval": trainer.first_eval,
            "final_eval": trainer.last_eval,
            **trainer.counts,
            "strategy": trainer.strategy.name,
            "run_dir": str(run_dir),
        }
        (run_dir / "summary.json").write_text(jsonio.dumps(summary, indent=1, default=str))
    sink.close()
    return sentence


def _failed(trainer: Trainer, run_dir: Path, rank: int, cause: str) -> None:
    """After an exception in training: summary.json with ``"status": "failed"``, the cause and the iterations
    done (rank 0; every one is in metrics.jsonl), so a failed run is told apart from one still running. A
    failure to write it is logged: the exception that stopped the run is the one raised."""
    if rank != 0:
        return
    st = trainer.state
    summary = {
        "status": "failed",
        "cause": cause,
        "iterations": st.iteration,
        "effective_iterations": st.effective_iteration,
        "first_eval": trainer.first_eval,
        "final_eval": trainer.last_eval,
        **trainer.counts,
        "strategy": trainer.strategy.name,
        "run_dir": str(run_dir),
    }
    try:
        (run_dir / "summary.json").write_text(jsonio.dumps(summary, indent=1, default=str))
    except OSError as exc:
        log.error("could not write %s: %s", run_dir / "summary.json", exc)


def run_simulation(opts: SimulateOptions, argv: list[str] | None = None) -> dict[str, Any]:
    """Run one simulation end to end; returns the summary (rank 0 also writes summary.json).

    Everything is validated (:func:`checkfree.sim.preflight.preflight`) before the run directory is created or
    touched, so a refused run changes nothing on disk.
    """
    pre = preflight(opts)
    cfg, p, p_source = pre.cfg, pre.probability, pre.probability_source
    owns_group = not dist.is_initialized()
    rank, world, group, device = _init_distributed(opts)
    try:
        run_dir = _claim_run_dir(pre.run_dir, rank, world)
        _setup_logging(run_dir, rank)
        for warning in pre.warnings:
            log.warning("%s", warning)
        if rank == 0:
            (run_dir / "config.json").write_text(jsonio.dumps(cfg.to_json(), indent=1))
            cmd = " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv))
            with open(run_dir / "command.txt", "a") as f:
                f.write(cmd + "\n")
            (run_dir / "options.json").write_text(
                jsonio.dumps(dataclasses.asdict(opts), indent=1, default=str)
            )
        log.info("run directory %s", run_dir)
        corpus, batches, val = _prepare_data(cfg, opts, rank, world)
        log.info("data: %s", corpus.describe())
        budget_line, data_epochs = data_budget_line(cfg, world, len(corpus.train))
        log.info("data: %s", budget_line)
        strategy = pre.recovery_strategy
        source = pre.source
        log.info(
            "strategy %s, swaps %s, p_iter %.6g from %s, grad_norm_mode %s",
            strategy.name,
            opts.swaps,
            p,
            p_source,
            cfg.grad_norm_mode,
        )
        stages = split_model(build_hf_model(cfg, corpus.vocab_size, cfg.seed, corpus.eos_id), cfg)
        peak = device_peak(device, opts.peak_tflops)
        log.info(
            "device %s, autocast %s, compile %s, activation checkpointing %s; MFU peak: %s",
            device,
            opts.autocast,
            opts.compile,
            opts.activation_checkpointing,
            peak.source,
        )
        log.info("%s", pre.loss_path.line)
        progress = None
        if rank == 0 and opts.progress:  # a bar on a terminal only; log lines otherwise (monitoring.py)
            progress = progress_bar(cfg.max_iterations, opts.start_iter, strategy.name)
        mirror = TensorBoardMirror(run_dir / TENSORBOARD_DIR) if opts.tensorboard and rank == 0 else None
        sink = MetricsSink(run_dir / "metrics.jsonl" if rank == 0 else None, mirror=mirror)
        ctx = RunContext(
            sink=sink,
            checkpoint_dir=run_dir / "checkpoints",
            rank=rank,
            world_size=world,
            group=group,
            device=device,
            progress=progress,
            autocast=opts.autocast,
            compile=opts.compile,
            compile_backend=opts.compile_backend,
            compile_mode=opts.compile_mode,
            activation_checkpointing=opts.activation_checkpointing,
            fused_loss=pre.loss_path.fused,
            peak=peak,
            recovery_accounting=opts.recovery_accounting,
        )
        # The global generator (CPU and every CUDA device) is what the checkpoints save as "rng/torch" and
        # "rng/cuda"; left alone its state depends on what the process did before (data preparation, a library
        # seeding it from the clock), so two runs with the same seed would differ. A resume restores it.
        torch.manual_seed(cfg.seed)
        trainer = Trainer(
            cfg,
            stages,
            batches,
            val,
            strategy,
            source,
            ctx,
            swaps=opts.swaps,
            max_wall_iterations=opts.max_wall_iterations,
            data_fingerprint=pre.data_fingerprint,
            stop_at_loss=opts.stop_at_loss,
            final_checkpoint=opts.final_checkpoint,
        )
        if pre.resume is not None:
            trainer.resume(Path(pre.resume))
        try:
            summary = trainer.train()
        except KeyboardInterrupt as exc:
            raise RunInterrupted(_interrupted(trainer, run_dir, rank, sink, str(exc) or "SIGINT")) from None
        except Exception as exc:  # written down, then raised as before (a bug, a lost peer, a full disk…)
            _failed(trainer, run_dir, rank, f"{type(exc).__name__}: {exc}")
            raise
        if progress is not None:
            progress.close()
        summary.update(
            {
                "status": "completed" if summary.get("stopped") is None else "failed",
                "cause": summary.get("stopped"),
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
                "data_epochs": round(data_epochs, 4),
            }
        )
        summary.update(replica_shortage(source, cfg.max_iterations))
        if rank == 0:
            (run_dir / "summary.json").write_text(jsonio.dumps(summary, indent=1, default=str))
        sink.close()
        return summary
    finally:
        _close_logging()
        if owns_group and dist.is_initialized():
            dist.destroy_process_group()
