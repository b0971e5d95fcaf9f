"""``python -m checkfree probe CHECKPOINT_DIR``: the stage-loss probe (the mechanism of the paper's Fig. 2, cheaply).

For every (stage, strategy, seed) it loads a trained state, loses the stage, rebuilds it with the strategy, and
measures the validation loss (mean cross-entropy, nats) after 0, 1, 10 and K steps of continued training, plus
how far the rebuilt weights are from the lost ones (:func:`weight_distance`). The seed sets the data order after
the failure (``data_seed + seed``) and the strategy's own seed (random init). Each seed also trains K steps with
nothing lost: the ``no_failure`` reference every cell is paired with. When a strategy runs with CheckFree+ swaps
(``checkfree_plus``, ``ladder``), each seed also trains a ``no_failure`` reference with swaps, and those cells are
paired with it, so their paired damage is the recovery's alone, not the cost of the swapped stage order (paper
Fig. 4c) on a base trained without swaps. ``--swaps`` trains every cell and the reference with swaps: the regime
of a base trained with swaps (``run.sh``), where CheckFree+ is measured on its own terms.

Outputs in ``--out``: ``probe.json`` (every cell), ``probe.md`` (mean ± 95 % Student-t interval per (stage,
strategy), see :mod:`checkfree.report.stats`) and ``probe.png``. Each finished cell is also appended to
``cells.jsonl`` at once, so a probe that is killed (a preempted machine, a closed session) loses at most the cell
it was in: the same command again reuses every finished cell of the same checkpoint and step counts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from checkfree import jsonio
from checkfree.checkpoint import store
from checkfree.config import Config, config_from_dict
from checkfree.model import build_hf_model, split_model
from checkfree.pipeline import MIN_STAGES_FOR_SWAPS
from checkfree.recovery.registry import REGISTRY, make_strategy
from checkfree.rundir import check_output_dir, claim_output_dir
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.recovery_accounting import weight_distance

MARKER = "checkfree_probe.json"
"""Marks a directory as a probe's output, which a later probe may resume or replace (checkfree.rundir)."""
CELLS = "cells.jsonl"
"""One JSON line per finished cell, written as it finishes: what a rerun resumes from."""

CellKey = tuple[int | None, str, int, bool]
"""(stage or None for a reference, strategy, seed, swaps): one cell of the probe, and its resume key."""


@dataclass
class Cell:
    """One (stage, strategy, seed): validation loss after each step count, and the weight distances."""

    stage: int | None
    strategy: str
    seed: int
    losses: dict[int, float]
    rule: str = ""
    weight_rel_l2: float | None = None
    weight_cosine: float | None = None
    swaps: bool = False
    """Trained with CheckFree+ swaps after the failure (a swap strategy, or the swapped no_failure reference)."""

    @property
    def key(self) -> CellKey:
        return (self.stage, self.strategy, self.seed, self.swaps)


def cell_json(cell: Cell) -> dict[str, Any]:
    """The JSON form of a cell (step counts as string keys), as in cells.jsonl and probe.json."""
    return cell.__dict__ | {"losses": {str(k): v for k, v in cell.losses.items()}}


def cell_from_json(line: str) -> Cell | None:
    """A cell from one line of cells.jsonl; None for a line cut short by a kill or not a cell."""
    try:
        d = jsonio.loads(line)
        cell = Cell(
            d["stage"],
            d["strategy"],
            int(d["seed"]),
            {int(k): float(v) for k, v in d["losses"].items()},
            d.get("rule", ""),
            d.get("weight_rel_l2"),
            d.get("weight_cosine"),
            bool(d.get("swaps", False)),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    if cell.stage is not None and not isinstance(cell.stage, int):
        return None
    return cell


def same_identity(out: Path, identity: dict[str, Any]) -> bool:
    """Whether ``out`` holds a probe of the same checkpoint and step counts (``identity``), so its cells count."""
    try:
        return json.loads((out / MARKER).read_text()).get("identity") == identity
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def finished_cells(out: Path, identity: dict[str, Any]) -> dict[CellKey, Cell]:
    """The cells a probe into ``out`` finished for the same ``identity`` (checkpoint and step counts).

    An earlier probe of another checkpoint or other step counts is not resumed: none of its cells is returned.
    """
    cells_file = out / CELLS
    if not cells_file.is_file() or not same_identity(out, identity):
        return {}
    found: dict[CellKey, Cell] = {}
    for line in cells_file.read_text().splitlines():
        cell = cell_from_json(line)
        if cell is not None:
            found[cell.key] = cell
    return found


def append_cell(out: Path, cell: Cell) -> None:
    """Append one finished cell to cells.jsonl and fsync it (one write: concurrent shards never interleave).

    A line cut short by a kill is ended first, so the new cell is not glued onto it.
    """
    line = jsonio.dumps(cell_json(cell)) + "\n"
    with open(out / CELLS, "ab+") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def locked(out: Path, timeout_s: float = 60.0) -> Iterator[None]:
    """Hold an exclusive lock on the directory ``out`` (which must exist) for the duration of the block.

    Holders only read and write a few small files, so waiting ``timeout_s`` means something is wrong.

    Raises:
        TimeoutError: another process held the lock for ``timeout_s`` seconds.
    """
    fd = os.open(out, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{out} stayed locked by another probe for {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


log = logging.getLogger(__name__)

FIG2_RULES = ("random", "copy", "zero", "average", "checkfree", "checkfree_plus")
"""The neighbour rules of the paper's Fig. 2 (and its ablations): the default ``--strategies``."""


@dataclass
class ProbeOptions:
    """What ``python -m checkfree probe`` accepts."""

    checkpoint: Path
    out: Path
    strategies: list[str] = field(default_factory=lambda: list(FIG2_RULES))
    stages: list[int] | None = None
    """Stages to lose (default: every transformer stage 1..S)."""
    seeds: int = 3
    steps: int = 100
    cache_dir: Path | None = None
    swaps: bool = False
    """Every cell (and the reference) trains with CheckFree+ swaps; else only the strategies that need them."""
    shard: tuple[int, int] | None = None
    """(K, N): compute only every N-th cell, starting with the K-th (1-based), so N processes share the probe."""


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory, or a run directory's newest checkpoint.

    Raises:
        FileNotFoundError: neither a checkpoint nor a run directory holding one.
    """
    if (path / "meta.json").is_file():
        return path
    found = store.list_checkpoints(path / "checkpoints") if (path / "checkpoints").is_dir() else []
    if not found:
        raise FileNotFoundError(
            f"{path} is neither a checkpoint directory (with meta.json) nor a run directory with checkpoints/."
        )
    return found[-1]


def validate(opts: ProbeOptions, cfg: Config) -> list[int]:
    """The stages to probe; raises ValueError for an unknown strategy, a bad stage, seed count or step count."""
    for name in opts.strategies:
        if name not in REGISTRY or not REGISTRY[name].loses_state:
            rebuilds = sorted(n for n, c in REGISTRY.items() if c.loses_state)
            raise ValueError(f"--strategies names {name!r}; expected some of: {', '.join(rebuilds)}.")
    stages = opts.stages if opts.stages is not None else list(range(1, cfg.n_stages + 1))
    for s in stages:
        if not 0 <= s <= cfg.n_stages:
            raise ValueError(f"--stages names {s}; the checkpoint's stages are 0..{cfg.n_stages}.")
    if opts.seeds < 1 or opts.steps < 1:
        raise ValueError(f"--seeds {opts.seeds} and --steps {opts.steps} must both be ≥ 1.")
    if opts.shard is not None and not 1 <= opts.shard[0] <= opts.shard[1]:
        raise ValueError(f"--shard {opts.shard[0]}/{opts.shard[1]}; expected K/N with 1 ≤ K ≤ N.")
    if (opts.swaps or any(REGISTRY[n].swaps for n in opts.strategies)) and (
        cfg.n_stages < MIN_STAGES_FOR_SWAPS
    ):
        raise ValueError(
            f"--swaps or --strategies asks for CheckFree+ swaps, which need n_stages ≥ {MIN_STAGES_FOR_SWAPS}; "
            f"the checkpoint has {cfg.n_stages}."
        )
    return stages


def checkpoints_of_steps(k: int) -> list[int]:
    """Step counts at which the validation loss is measured: 0, 1, 10 and K (those ≤ K)."""
    return sorted({s for s in (0, 1, 10, k) if s <= k})


@dataclass
class ProbeData:
    """What the probe trains and validates on (a constructor argument, so tests pass small fakes).

    ``batches(seed)`` returns a batch source (``.batch(step)`` → (B, T+1) token ids) whose order depends on
    ``seed``; ``val`` are the validation batches, (B, T+1) each.
    """

    vocab_size: int
    eos_id: int | None
    batches: Callable[[int], Any]
    val: list[torch.Tensor]


def corpus_data(cfg: Config, cache_dir: Path | None) -> ProbeData:
    """The run's own corpus and tokenizer (from the token cache), data order ``data_seed + seed``."""
    from checkfree.data.batches import BatchSource, validation_batches
    from checkfree.data.corpus import prepare_corpus
    from checkfree.sim.launch import data_spec

    corpus = prepare_corpus(data_spec(cfg, 1, cache_dir))

    def batches(seed: int) -> BatchSource:
        return BatchSource(
            corpus.train, cfg.seq_l, cfg.batch_size, rank=0, world_size=1, seed=cfg.data_seed + seed
        )

    val = validation_batches(corpus, cfg.batch_size, cfg.validation, cfg.seq_l)
    return ProbeData(corpus.vocab_size, corpus.eos_id, batches, val)


class _Probe:
    """Builds a fresh trainer from the checkpoint for each cell."""

    def __init__(self, snap_path: Path, cfg: Config, data: ProbeData):
        self.path, self.data = snap_path, data
        self.cfg = dataclasses.replace(
            cfg, save_mode="memory"
        )  # the checkpoint baselines keep RAM copies only

    def trainer(self, strategy: str, seed: int, swaps: bool) -> Trainer:
        cfg, data = self.cfg, self.data
        stages = split_model(build_hf_model(cfg, data.vocab_size, cfg.seed, data.eos_id), cfg)
        strat = make_strategy(strategy, cfg, swaps, seed=seed)
        ctx = RunContext(sink=_Records())
        t = Trainer(cfg, stages, data.batches(seed), data.val, strat, _NoFailures(), ctx, swaps)
        t.resume(self.path)
        strat.setup(t.state)
        return t

    def cell(self, stage: int | None, strategy: str, seed: int, swaps: bool, steps: list[int]) -> Cell:
        t = self.trainer(strategy, seed, swaps)
        out = Cell(stage, strategy, seed, {}, swaps=swaps)
        if stage is not None:
            lost = t.state.stage_state(stage)
            t.strategy.begin_iteration(t.state, [stage])
            t.lose_stages([stage])
            out.weight_rel_l2, out.weight_cosine = weight_distance(t.state.stage_state(stage), lost)
            rec = [r for r in t.ctx.sink.records if r["kind"] == "recovery"][-1]
            out.rule = rec["rule"] + (f" ({rec['rung']} rung)" if rec.get("rung") else "")
        done = 0
        for k in steps:
            while done < k:
                t.step()
                done += 1
            out.losses[k] = t.evaluate()[0]
        t.strategy.finish(t.state)
        return out


class _NoFailures:
    def draw(self, iteration: int) -> list[int]:
        return []


class _Records:
    """A metrics sink that keeps the records in memory (the probe reads the recovery's rule from them)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def write(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, **fields})

    def close(self) -> None:
        pass


def probe_jobs(opts: ProbeOptions, stages: list[int]) -> list[CellKey]:
    """Every (stage, strategy, seed, swaps) to measure: the no-failure references first (stage None), with swaps
    too when a strategy needs them; stage 0 only under strategies that can rebuild it."""
    swapped = [opts.swaps or REGISTRY[n].swaps for n in opts.strategies]
    seeds = range(opts.seeds)
    references = [True] if opts.swaps else sorted({False, *swapped})
    jobs = [(None, "no_failure", s, swaps) for swaps in references for s in seeds]
    for st in stages:
        for name, swaps in zip(opts.strategies, swapped, strict=True):
            if st == 0 and not REGISTRY[name].recovers_stage0:
                log.info("skip stage 0 under %s: it cannot recover stage 0", name)
                continue
            jobs += [(st, name, s, swaps) for s in seeds]
    return jobs


def run_probe(opts: ProbeOptions, data: ProbeData | None = None) -> dict[str, Any]:
    """Run every cell (or this shard's); write probe.json, probe.md and probe.png into ``opts.out``; return
    probe.json's content, or, for a shard that finished before another, ``{"complete": False, ...}``.

    ``data`` defaults to the run's corpus (:func:`corpus_data`). Cells an interrupted probe into the same ``out``
    finished for the same checkpoint and step counts are reused, not recomputed (:func:`finished_cells`). With
    ``opts.shard = (K, N)`` this process computes cells K, K+N, K+2N, … of the plan (1-based); N processes with
    K = 1..N share one ``out``, and whichever finishes last writes the report from everyone's cells.

    Raises:
        FileNotFoundError / CheckpointError: the checkpoint is missing or corrupt.
        ValueError: a bad option (see :func:`validate`), or ``out`` holds something that is not a probe's output.
    """
    from checkfree.probe import report

    path = resolve_checkpoint(opts.checkpoint)
    meta = store.read_checkpoint(path).meta
    cfg = config_from_dict(meta["config"], f"checkpoint {path}")
    stages = validate(opts, cfg)
    check_output_dir(opts.out, MARKER, "probe output")
    steps = checkpoints_of_steps(opts.steps)
    identity = {
        "checkpoint": str(path.resolve()),
        "effective_iteration": meta["effective_iteration"],
        "steps": steps,
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    with locked(opts.out):  # the first of several shards claims the directory; the others join it
        if not same_identity(opts.out, identity):
            claim_output_dir(opts.out, MARKER, {"identity": identity, "command": "python -m checkfree probe"})
            (opts.out / CELLS).write_text("")
        done = finished_cells(opts.out, identity)
    probe = _Probe(path, cfg, data or corpus_data(cfg, opts.cache_dir))
    t0 = time.perf_counter()
    jobs = probe_jobs(opts, stages)
    k, n = opts.shard or (1, 1)
    computed = 0
    for i in range(k - 1, len(jobs), n):
        stage, name, seed, swaps = job = jobs[i]
        label = name + (" +swaps" if swaps and stage is None else "")
        where = f"[{i + 1}/{len(jobs)}] stage {'—' if stage is None else stage}, {label}, seed {seed}"
        if job in done:
            log.info("%s: finished earlier (%s)", where, CELLS)
            continue
        cell = probe.cell(*job, steps)
        append_cell(opts.out, cell)
        computed += 1
        losses = ", ".join(f"{s}: {v:.4f}" for s, v in cell.losses.items())
        log.info("%s: val loss %s (%.0f s)", where, losses, time.perf_counter() - t0)
    seconds = round(time.perf_counter() - t0, 1)
    with locked(opts.out):
        finished = finished_cells(opts.out, identity)
        if any(job not in finished for job in jobs):
            count = sum(job in finished for job in jobs)
            log.info(
                "shard %d/%d done: %d of %d cells finished; the last shard writes the report",
                k,
                n,
                count,
                len(jobs),
            )
            return {
                "complete": False,
                "finished": count,
                "total": len(jobs),
                "computed": computed,
                "seconds": seconds,
            }
        result = {
            "format": "checkfree-probe-v1",
            "checkpoint": str(path),
            "effective_iteration": meta["effective_iteration"],
            "config": cfg.to_json(),
            "steps": steps,
            "seeds": opts.seeds,
            "seconds": seconds,
            "resumed_cells": len(jobs) - computed,
            "cells": [cell_json(finished[job]) for job in jobs],
        }
        (opts.out / "probe.json").write_text(jsonio.dumps(result, indent=1))
        report.write(result, opts.out)
    return result


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``probe`` sub-command."""
    p = sub.add_parser(
        "probe", help="lose each stage of a trained checkpoint, rebuild it, measure the damage"
    )
    p.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_DIR", help="checkpoint or run directory")
    p.add_argument("--strategies", default=",".join(FIG2_RULES), help="comma-separated strategy names")
    p.add_argument("--stages", type=_int_list, help="comma-separated stages to lose (default 1..S)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell (data order after the failure)")
    p.add_argument("--steps", type=int, default=100, help="K: steps of continued training")
    p.add_argument(
        "--out", type=Path, required=True, help="output directory (probe.json, probe.md, probe.png)"
    )
    p.add_argument("--cache-dir", type=Path, help="token/tokenizer cache of the run (default as simulate)")
    p.add_argument(
        "--swaps",
        action="store_true",
        help="every cell trains with CheckFree+ swaps (for a base trained with swaps, run.sh)",
    )
    p.add_argument(
        "--shard",
        type=_shard,
        metavar="K/N",
        help="compute every N-th cell from the K-th; run K = 1..N at once into one --out to use N cores",
    )
    p.set_defaults(func=_cmd)


def _shard(text: str) -> tuple[int, int]:
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not K/N (two positive integers, e.g. 1/2)")
    return int(k), int(n)


def _cmd(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    opts = ProbeOptions(
        args.checkpoint,
        args.out,
        strategies,
        args.stages,
        args.seeds,
        args.steps,
        args.cache_dir,
        args.swaps,
        args.shard,
    )
    result = run_probe(opts)
    if result.get("complete") is False:
        print(
            f"probe --shard {args.shard[0]}/{args.shard[1]}: {result['computed']} cells in {result['seconds']:.0f} s;"
            f" {result['finished']} of {result['total']} cells finished, the last shard to finish writes probe.md"
        )
    else:
        print(f"probe: {len(result['cells'])} cells in {result['seconds']:.0f} s → {args.out / 'probe.md'}")
    return 0
