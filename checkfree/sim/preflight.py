"""Everything a simulator run validates before it touches the disk (docs/simulator.md, Outputs).

:func:`preflight` checks the config, the options, the failure source, the data source, the device, the run
directory and the resume checkpoint, and returns what the run needs; it writes nothing. A failed check raises
one of the project's user-error classes (ValueError and its subclasses ConfigError and DirectoryConflictError,
FileNotFoundError, CheckpointError, DataUnavailableError) with one sentence, so a failed validation leaves every
directory as it was. Things that are accepted but probably not meant (a key given twice, a schedule entry with an
unknown key, a failure past max_iterations, an unused ``--iteration-seconds``) become ``warnings`` for the run log.

Memory (:func:`check_memory`, checkfree/memory.py): before anything is built, a rank's peak memory is estimated
from the config's shapes and compared with what the rank gets: on CUDA the GPU's ``total_memory``, on the CPU the
host's available memory shared by the ranks of this machine. A run that needs more than 90 % of it is refused
with one sentence naming the estimate, the memory and what would make it fit (``--activation-checkpointing``, a
smaller microbatch at the same sequences per iteration, fewer ranks per machine). A dry run prints the estimate
and the verdict but is not refused, so a run for a larger machine can be planned on a small one.
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

from checkfree import memory
from checkfree.checkpoint import store
from checkfree.config import Config, load_config
from checkfree.devices import autocast_context
from checkfree.failures.injection import StageFailureInjector, StageFailureSource
from checkfree.failures.rates import PAPER_ITERATION_SECONDS, resolve_failure_probability
from checkfree.failures.schedules import load_stage_schedule
from checkfree.failures.traces import DOWNTIME_FORMAT, parse_downtime
from checkfree.loss import LossPath, resolve_loss_path
from checkfree.pipeline import stage_order
from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.registry import make_strategy, resolve_setting
from checkfree.rundir import RunDirPlan, check_directory_path, holds_something, plan_run_dir
from checkfree.sim.options import SimulateOptions

STAGE_ENTRY_KEYS = ("iteration", "stage")


@dataclass
class Preflight:
    """What a validated run needs: resolved config and strategy, failure source, run directory plan, resume."""

    cfg: Config
    recovery_strategy: RecoveryStrategy
    """The run's strategy, built once here (to validate it) and handed to the trainer (checkfree.sim.launch)."""
    probability: float
    probability_source: str
    source: StageFailureSource
    run_dir: RunDirPlan
    resume: Path | None
    data_fingerprint: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    memory: MemoryCheck | None = None
    loss_path: LossPath = LossPath(False, "--fused-loss off")
    """The loss the trainer uses (``--fused-loss``; checkfree.loss.resolve_loss_path), logged in one line."""

    @property
    def strategy(self) -> str:
        """The strategy's canonical name."""
        return self.recovery_strategy.name


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


def resolve_device(device: str) -> str:
    """``--device`` → where a rank computes: "cuda" for cuda, and for auto when torch sees a CUDA device; else
    "cpu" (the rule of checkfree/sim/launch.py)."""
    return "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"


def ranks_per_machine(world_size: int) -> int:
    """Ranks that share this machine: torchrun's ``LOCAL_WORLD_SIZE``, else WORLD_SIZE / ``NNODES`` (the
    launchers' variable, default 1), at least 1."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit() and int(local) > 0:
        return int(local)
    nodes = os.environ.get("NNODES", "")
    nodes_n = int(nodes) if nodes.isdigit() and int(nodes) > 0 else 1
    return max(1, math.ceil(world_size / nodes_n))


@dataclass(frozen=True)
class MemoryCheck:
    """A rank's memory estimate (checkfree.memory) against what it gets, and what would make it fit.

    Attributes:
        estimate: one rank's estimate. where: "cuda:N" or "host". capacity: bytes of the GPU (one rank each) or of
        host memory available (shared by ``ranks``). ranks: ranks on the memory (1 on a GPU). host_need,
        host_memory: on CUDA, host RAM the ranks of this machine need and have (0, 0 on the CPU).
        advice: what would make it fit ("" when it fits, or when nothing short of another machine does).
    """

    estimate: memory.MemoryEstimate
    where: str
    capacity: int
    ranks: int
    host_need: int
    host_memory: int
    advice: str

    @property
    def need(self) -> int:
        """Bytes needed on ``where``: one rank on a GPU, every rank of this machine on the host."""
        return self.estimate.total * self.ranks

    @property
    def fits(self) -> bool:
        host_ok = memory.fits(self.host_need, self.host_memory) if self.host_memory else True
        return memory.fits(self.need, self.capacity) and host_ok

    def verdict(self) -> str:
        """One line: need, memory, fits or not (and what would make it fit)."""
        per = f"{self.ranks} ranks × {memory.gib(self.estimate.total)} = " if self.ranks > 1 else ""
        have = "available host RAM" if self.where == "host" else f"{self.where}'s memory"
        line = f"memory: {per}{memory.gib(self.need)} of {memory.gib(self.capacity)} {have}"
        if self.host_memory:
            line += f"; host RAM {memory.gib(self.host_need)} of {memory.gib(self.host_memory)} available"
        if self.fits:
            return f"{line}: fits (≤ {memory.FIT_FRACTION:.0%})"
        return f"{line}: does not fit{f'; it would with {self.advice}' if self.advice else ''} (a real run is refused)"

    def lines(self) -> list[str]:
        e = self.estimate
        title = (
            f"memory per rank, estimated from the config's shapes ({e.device}, {e.precision}, activation "
            f"checkpointing {'on' if e.activation_checkpointing else 'off'}; checkfree/memory.py):"
        )
        return [*e.describe(title).splitlines(), self.verdict()]

    def sentence(self) -> str:
        """The refusal: one sentence naming the estimate, the memory and the way out."""
        e = self.estimate
        parts = ", ".join(
            f"{label.split(' (')[0]} {memory.gib(getattr(e, name))}"
            for name, label in sorted(memory.PARTS, key=lambda p: -getattr(e, p[0]))[:2]
        )
        if not memory.fits(self.need, self.capacity):
            ranks = f" ({self.ranks} ranks × {memory.gib(e.total)})" if self.ranks > 1 else ""
            have = (
                f"this machine has {memory.gib(self.capacity)} of host RAM available"
                if self.where == "host"
                else f"{self.where} has {memory.gib(self.capacity)}"
            )
            what = f"about {memory.gib(self.need)}{ranks} on {'the host' if self.where == 'host' else self.where}"
        else:
            have = f"this machine has {memory.gib(self.host_memory)} of host RAM available"
            what = (
                f"about {memory.gib(self.host_need)} of host RAM for its {self.ranks} rank(s) besides the GPU"
            )
        if self.advice:
            way = f"it would fit with {self.advice}"
        elif not memory.fits(e.static * self.ranks, self.capacity):
            way = (
                f"the weights, gradients and Adam state alone need {memory.gib(e.static * self.ranks)}: use a "
                "smaller model (--set dmodel, n_layers_per_stage or n_stages) or a machine with more memory"
            )
        else:
            way = "use a machine with more memory"
        return (
            f"this run needs {what} (estimated from the config's shapes, largest parts: {parts}), but {have} "
            f"and a run must fit in {memory.FIT_FRACTION:.0%} of it; {way}."
        )


def check_memory(opts: SimulateOptions, cfg: Config, strategy: str) -> MemoryCheck:
    """A rank's estimated peak memory against its device (module docstring); builds and allocates nothing.

    ``strategy``: the canonical setting (its copies count). The GPU is the rank's ``LOCAL_RANK`` (0 outside
    torchrun); host memory is ``MemAvailable`` (checkfree.memory.available_host_memory).
    """
    device = resolve_device(opts.device)
    # the rule of checkfree.devices.autocast_context: bf16 on CUDA for "auto", on any device for "bf16"
    autocast = opts.autocast == "bf16" or (opts.autocast == "auto" and device == "cuda")
    vocab = memory.model_vocab_size(cfg)
    fused = resolve_loss_path(opts.fused_loss, device).fused
    ranks = ranks_per_machine(opts.world_size)
    host_memory = memory.available_host_memory()
    if device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0") or 0)
        gpu = memory.gpu_memory(index)
        if gpu is None:
            raise ValueError(
                f"this rank's LOCAL_RANK {index} names no CUDA device (torch sees {torch.cuda.device_count()}); "
                "expected at most one rank per GPU on each machine."
            )
        where, device_memory, on_device = f"cuda:{index}", gpu, 1
    else:
        where, device_memory, on_device = "host", host_memory, ranks

    def estimate(checkpointing: bool, batch: int) -> memory.MemoryEstimate:
        return memory.simulator_estimate(cfg, vocab, device, autocast, checkpointing, strategy, batch, fused)

    def fits(e: memory.MemoryEstimate) -> bool:
        host_ok = device == "cpu" or memory.fits(ranks * e.host, host_memory)
        return memory.fits(on_device * e.total, device_memory) and host_ok

    est = estimate(opts.activation_checkpointing, cfg.batch_size)
    advice = ""
    if not fits(est):
        advice = _memory_advice(
            cfg, opts.activation_checkpointing, estimate, fits, ranks, device, device_memory
        )
    host_need, host_have = (ranks * est.host, host_memory) if device == "cuda" else (0, 0)
    return MemoryCheck(est, where, device_memory, on_device, host_need, host_have, advice)


def _memory_advice(
    cfg: Config, checkpointing: bool, estimate, fits, ranks: int, device: str, device_memory: int
) -> str:
    """What would make a rank fit: --activation-checkpointing, and/or the largest microbatch (batch_size) that
    fits at the same sequences per iteration (batch_size × mb_count); on the CPU else fewer ranks on this
    machine; "" when none of these does. ``estimate(checkpointing, batch)`` and ``fits(estimate)`` are
    :func:`check_memory`'s."""
    ways = []
    if not checkpointing and fits(estimate(True, cfg.batch_size)):
        ways.append("--activation-checkpointing")
    sequences = cfg.batch_size * cfg.mb_count
    for ckpt in [checkpointing] if checkpointing or ways else [False, True]:
        batch = _largest_batch(cfg.batch_size - 1, sequences, lambda b, c=ckpt: fits(estimate(c, b)))
        if batch is not None:
            flag = "--activation-checkpointing " if ckpt and not checkpointing else ""
            ways.append(
                f"{flag}--set batch_size={batch} --set mb_count={sequences // batch} (the same {sequences} "
                "sequences per iteration)"
            )
            break
    if not ways and device == "cpu" and ranks > 1:
        room = int(memory.FIT_FRACTION * device_memory // estimate(checkpointing, cfg.batch_size).total)
        if 1 <= room < ranks:
            ways.append(f"at most {room} rank(s) on this machine (more machines: NNODES, docs/gpu.md)")
    return ", or with ".join(ways)


def _largest_batch(upper: int, sequences: int, fits) -> int | None:
    """The largest b ≤ ``upper`` that divides ``sequences`` with ``fits(b)`` (memory grows with b: a binary
    search, then the nearest divisor below, looked for among 100,000 values at most); None when even b = 1 does
    not fit, ``upper`` < 1, or no divisor is near."""
    if upper < 1 or not fits(1):
        return None
    lo, hi = 1, upper
    while lo < hi:  # the largest b that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return next((b for b in range(lo, max(0, lo - 100_000), -1) if sequences % b == 0), None)


def memory_lines(opts: SimulateOptions) -> list[str]:
    """The dry run's memory table and verdict (:func:`check_memory`); raises what loading the config raises."""
    cfg = load_config(opts.config, config_overrides(opts))
    return check_memory(opts, cfg, resolve_setting(opts.setting, opts.swaps)).lines()


def _failure_source(opts: SimulateOptions, cfg: Config, probability: float) -> StageFailureSource:
    if opts.failure_schedule is not None:
        return load_stage_schedule(opts.failure_schedule, cfg.n_stages, opts.schedule_replicas)
    seed = cfg.seed if opts.failure_seed is None else opts.failure_seed
    return StageFailureInjector(cfg.n_stages, probability, seed, include_stage0=opts.fail_stage0)


def _check_throughput_options(opts: SimulateOptions) -> None:
    """--autocast, --peak-tflops, --compile-mode and --tensorboard (docs/simulator.md: Throughput and MFU, Live
    monitoring; docs/gpu.md)."""
    autocast_context(torch.device("cpu"), opts.autocast)  # raises ValueError for an unknown mode
    if opts.peak_tflops is not None and not (math.isfinite(opts.peak_tflops) and opts.peak_tflops > 0):
        raise ValueError(f"--peak-tflops is {opts.peak_tflops}; expected a positive number of TFLOP/s.")
    if opts.compile_mode not in ("default", "reduce-overhead"):
        raise ValueError(f"--compile-mode is {opts.compile_mode!r}; expected default or reduce-overhead.")
    if opts.compile_mode != "default" and not opts.compile:
        raise ValueError(
            f"--compile-mode {opts.compile_mode} was given without --compile; expected both, or neither."
        )
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
    if opts.stop_at_loss is not None and not (math.isfinite(opts.stop_at_loss) and opts.stop_at_loss > 0):
        raise ValueError(
            f"--stop-at-loss is {opts.stop_at_loss!r}; expected a positive validation loss in nats."
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
    loss_path = resolve_loss_path(opts.fused_loss, resolve_device(opts.device))  # "on" without CUDA: refused
    mem = check_memory(opts, cfg, strategy.name)
    if not mem.fits and not opts.dry_run:
        raise ValueError(mem.sentence())
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
    return Preflight(cfg, strategy, p, p_source, source, plan, resume, fingerprint, warnings, mem, loss_path)
