"""Everything a simulator run validates before it touches the disk (docs/simulator.md, Outputs).

:func:`preflight` checks the config, the options, the failure source, the data source, the device, the run
directory and the resume checkpoint, and returns what the run needs; it writes nothing. A failed check raises
one of the project's user-error classes (ValueError and its subclasses ConfigError and DirectoryConflictError,
FileNotFoundError, CheckpointError, DataUnavailableError) with one sentence, so a failed validation leaves every
directory as it was. Things that are accepted but probably not meant (a key given twice, a schedule entry with an
unknown key, a failure past max_iterations, an unused ``--iteration-seconds``) become ``warnings`` for the run log.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from checkfree.checkpoint import store
from checkfree.config import Config, load_config
from checkfree.devices import autocast_context
from checkfree.failures.injection import StageFailureInjector, StageFailureSource
from checkfree.failures.rates import PAPER_ITERATION_SECONDS, resolve_failure_probability
from checkfree.failures.schedules import load_stage_schedule
from checkfree.failures.traces import DOWNTIME_FORMAT, parse_downtime
from checkfree.pipeline import stage_order
from checkfree.recovery.registry import make_strategy
from checkfree.rundir import RunDirPlan, check_directory_path, holds_something, plan_run_dir
from checkfree.sim.options import SimulateOptions

STAGE_ENTRY_KEYS = ("iteration", "stage")


@dataclass
class Preflight:
    """What a validated run needs: resolved config and strategy, failure source, run directory plan, resume."""

    cfg: Config
    strategy: str
    probability: float
    probability_source: str
    source: StageFailureSource
    run_dir: RunDirPlan
    resume: Path | None
    data_fingerprint: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def config_overrides(opts: SimulateOptions) -> dict[str, Any]:
    """The config keys that options override (None = not given)."""
    return {
        "max_iterations": opts.max_iterations,
        "eval_interval": opts.eval_interval,
        "log_interval": opts.log_interval,
        "checkpoint_interval": opts.checkpoint_interval,
        "seed": opts.seed,
        "grad_norm_mode": opts.grad_norm_mode,
        "max_train_tokens": opts.max_train_tokens,
        **opts.extra,
    }


def iteration_seconds(opts: SimulateOptions) -> float:
    """``--iteration-seconds``, or the paper's 91.32 s when not given."""
    return PAPER_ITERATION_SECONDS if opts.iteration_seconds is None else opts.iteration_seconds


def check_device(device: str) -> None:
    """Raises ValueError for ``--device cuda`` on a machine where torch sees no CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "--device cuda was given, but torch sees no CUDA device on this machine "
            "(torch.cuda.is_available() is False); expected --device cpu or --device auto."
        )


def data_fingerprint(cfg: Config) -> dict[str, Any]:
    """The identity of the training data: dataset and tokenizer, each with the sha256 that keys the data cache.

    Raises:
        ValueError: the dataset matches no files, or the tokenizer name is unknown.
        DataUnavailableError: the bundled corpus is not installed.
    """
    from checkfree.data import sources
    from checkfree.data import tokenizer as tok_mod

    kind = tok_mod.check_tokenizer_name(cfg.tokenizer_name, cfg.vocab_size)
    source = sources.resolve_source(cfg.dataset)
    return {
        "dataset": source.name,
        "dataset_sha256": source.fingerprint,
        "tokenizer": cfg.tokenizer_name,
        "tokenizer_sha256": tok_mod.tokenizer_fingerprint(cfg.tokenizer_name, kind, cfg.vocab_size),
    }


def _schedule_warnings(path: Path, max_iterations: int) -> list[str]:
    """Unknown keys in a stage schedule's entries, and failures that lie past max_iterations."""
    data = json.loads(Path(path).read_text())
    out: list[str] = []
    if isinstance(data, dict) and isinstance(data.get("failures"), list):
        unknown = sorted({k for e in data["failures"] for k in e if k not in STAGE_ENTRY_KEYS})
        if unknown:
            out.append(
                f"failure schedule {path} has entries with unknown keys {unknown}; they are ignored "
                f"(an entry holds {list(STAGE_ENTRY_KEYS)})."
            )
        iterations = [e["iteration"] for e in data["failures"]]
    elif isinstance(data, dict) and data.get("format") == DOWNTIME_FORMAT:
        iterations = [it for it, _ in parse_downtime(data, f"failure schedule {str(path)!r}").stage_losses()]
    elif isinstance(data, dict):
        iterations = [it for crashes in data.values() for it in crashes[:-1]]
    else:
        iterations = []
    late = sorted(it for it in iterations if it >= max_iterations)
    if late:
        out.append(
            f"failure schedule {path} has {len(late)} failure(s) at iterations >= max_iterations "
            f"{max_iterations} (first: {late[0]}); they happen only if rollbacks make the run that long."
        )
    return out


def _check_resume(
    path: Path, cfg: Config, fingerprint: dict[str, Any], allow_data_change: bool, warnings: list[str]
) -> None:
    """The resume checkpoint exists, its metadata is sound, its layers fit, and it was trained on this data.

    Raises:
        CheckpointError: missing, corrupt, a file missing or truncated, or another number of layers.
        ValueError: recorded on other data (dataset or tokenizer) and ``allow_data_change`` is False.
    """
    meta = store.read_meta(path)
    store.check_files(path, meta)
    total = meta["n_stages"] * meta["n_layers_per_stage"]
    if total != cfg.n_layers:
        raise store.CheckpointError(
            f"checkpoint {path} has {total} transformer layers; the config has "
            f"{cfg.n_stages} × {cfg.n_layers_per_stage} = {cfg.n_layers}."
        )
    recorded = meta.get("data")
    if not recorded:
        warnings.append(
            f"checkpoint {path} records no data fingerprint; the data it was trained on is unchecked."
        )
        return
    changed = [k for k in ("dataset_sha256", "tokenizer_sha256") if recorded.get(k) != fingerprint[k]]
    if not changed:
        return
    what = (
        f"dataset {recorded.get('dataset')!r} with tokenizer {recorded.get('tokenizer')!r}, but this run uses "
        f"dataset {fingerprint['dataset']!r} with tokenizer {fingerprint['tokenizer']!r}"
    )
    if not allow_data_change:
        differ = " and ".join(k.split("_")[0] for k in changed)
        raise ValueError(
            f"checkpoint {path} was trained on {what} (the {differ} "
            f"{'differs' if len(changed) == 1 else 'differ'}); expected the same data, or pass "
            "--allow-data-change to resume on the new data."
        )
    warnings.append(f"--allow-data-change: resuming checkpoint {path}, trained on {what}.")


def default_run_dir(opts: SimulateOptions, cfg: Config, strategy: str) -> Path:
    """``runs/<config>-<strategy>-p<P>-w<W>-seed<S>``; a fresh run takes the first of ``-2``, ``-3``… that is
    new or empty, so it never writes into another run's directory."""
    rate = f"{opts.rate:g}"
    base = opts.runs_root / f"{Path(opts.config).stem}-{strategy}-p{rate}-w{opts.world_size}-seed{cfg.seed}"
    if opts.start_iter > 0 or opts.overwrite:
        return base
    candidate, n = base, 1
    while holds_something(candidate):
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _failure_source(opts: SimulateOptions, cfg: Config, probability: float) -> StageFailureSource:
    if opts.failure_schedule is not None:
        return load_stage_schedule(opts.failure_schedule, cfg.n_stages, opts.schedule_replicas)
    seed = cfg.seed if opts.failure_seed is None else opts.failure_seed
    return StageFailureInjector(cfg.n_stages, probability, seed, include_stage0=opts.fail_stage0)


def _check_throughput_options(opts: SimulateOptions) -> None:
    """--autocast, --peak-tflops and --tensorboard (docs/simulator.md: Throughput and MFU, Live monitoring; docs/gpu.md)."""
    autocast_context(torch.device("cpu"), opts.autocast)  # raises ValueError for an unknown mode
    if opts.peak_tflops is not None and not (math.isfinite(opts.peak_tflops) and opts.peak_tflops > 0):
        raise ValueError(f"--peak-tflops is {opts.peak_tflops}; expected a positive number of TFLOP/s.")
    if opts.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(
            "--tensorboard needs the tensorboard package (pinned in requirements.txt); run ./setup.sh."
        )


def preflight(opts: SimulateOptions) -> Preflight:
    """Validate a run completely without writing anything; see the module docstring."""
    warnings: list[str] = []
    cfg = load_config(opts.config, config_overrides(opts), warnings)
    strategy = make_strategy(opts.setting, cfg, opts.swaps, seed=cfg.seed)
    if opts.swaps:
        stage_order(1, cfg.n_stages, True)  # raises for S < 4 with one sentence
    seconds = iteration_seconds(opts)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"--iteration-seconds is {seconds!r}; expected a positive number of seconds.")
    p, p_source = resolve_failure_probability(
        cfg.failure_probabilities, opts.rate, seconds, opts.failure_probability
    )
    if opts.iteration_seconds is not None and p_source != "formula":
        warnings.append(
            f"--iteration-seconds {opts.iteration_seconds:g} is not used: the per-iteration failure "
            f"probability comes from {p_source}."
        )
    if opts.max_wall_iterations is not None and opts.max_wall_iterations < 1:
        raise ValueError(
            f"--max-wall-iterations is {opts.max_wall_iterations}; expected a positive number of iterations."
        )
    source = _failure_source(opts, cfg, p)
    if opts.failure_schedule is not None:
        warnings += _schedule_warnings(opts.failure_schedule, cfg.max_iterations)
    has_stage0 = any(stage == 0 for _, stage in getattr(source, "all", list)())
    if (opts.fail_stage0 or has_stage0) and not strategy.recovers_stage0:
        raise ValueError(
            f"strategy {strategy.name!r} cannot recover stage 0 (embedding and head); only "
            "checkfree_plus and the checkpoint-based strategies can: drop stage 0 failures."
        )
    check_device(opts.device)
    _check_throughput_options(opts)
    cache = opts.cache_dir or os.environ.get("CHECKFREE_CACHE")
    if cache:
        check_directory_path(Path(cache), "--cache-dir" if opts.cache_dir else "$CHECKFREE_CACHE")
    fingerprint = data_fingerprint(cfg)
    if opts.run_dir is None:
        check_directory_path(opts.runs_root, "--runs-root")
    run_dir = Path(opts.run_dir or default_run_dir(opts, cfg, strategy.name))
    resume = opts.resume_from or (
        run_dir / "checkpoints" / f"iter_{opts.start_iter:07d}" if opts.start_iter > 0 else None
    )
    if resume is not None:
        _check_resume(Path(resume), cfg, fingerprint, opts.allow_data_change, warnings)
    plan = plan_run_dir(run_dir, resume_from=resume, overwrite=opts.overwrite)
    return Preflight(cfg, strategy.name, p, p_source, source, plan, resume, fingerprint, warnings)
