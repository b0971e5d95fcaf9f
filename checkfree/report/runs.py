"""Reading run directories for the report, tolerantly: a malformed directory is reported and skipped.

A simulator run directory (checkfree.sim.launch) holds config.json, options.json, metrics.jsonl and, once finished,
summary.json. A swarm run directory holds throughput.json (its keys are read defensively: whatever is missing is
listed, never fatal).

Recovery records, the simulator's "recovery" lines and the swarm's ``crashes`` rows alike, are read as the one
schema of checkfree/recovery/record.py: records written before it (benchmarks/results/) go through its one legacy
mapping (:func:`checkfree.recovery.record.upgrade`), so every reader here sees ``source_stages``,
``source_nodes`` and the one latency key ``latency_s``.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.recovery.record import LATENCY_KEY, upgrade
from checkfree.report.timing import RunCosts
from checkfree.schemas.run_files import Summary, ThroughputRow
from checkfree.settings import canonical_name
from checkfree.telemetry.metrics import read_metrics

log = logging.getLogger(__name__)


class RunDirError(ValueError):
    """A directory is not a usable run directory; the message is one sentence saying why."""


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _read_json(path: Path, schema: Any = None) -> Any:
    """The JSON in ``path`` (at most 64 MiB and 32 deep, checkfree.schemas.limits), checked against ``schema`` (a
    pydantic model of checkfree.schemas.run_files) when given; a dict is returned as read.

    Raises:
        RunDirError: unreadable, too large or deep, not JSON, or not of the schema (one sentence).
    """
    from checkfree.schemas.errors import validate
    from checkfree.schemas.limits import MAX_RESULT_BYTES, load_json

    try:
        data = load_json(path, "run file", MAX_RESULT_BYTES, jsonio.loads)
    except OSError as e:
        raise RunDirError(f"{path} cannot be read ({e.strerror}).") from None
    except ValueError as e:
        raise RunDirError(str(e)) from None
    if schema is not None:
        validate(schema, data, str(path), RunDirError)
    return data


NOT_ENDED = "still running, killed, stopped or crashed"
"""Why a run without an outcome has none (the report's words for it)."""


def stopped_early(summary: dict[str, Any]) -> bool:
    """A run that a signal (``"status": "interrupted"``) or an exception (``"failed"`` without the trainer's
    ``ended_by``) stopped before its own end: like a run with no summary.json, it has no outcome to compare. A run
    the trainer ended at --max-wall-iterations is ``"failed"`` with ``ended_by`` and is an outcome (censored)."""
    status = summary.get("status")
    return status == "interrupted" or (status == "failed" and "ended_by" not in summary)


@dataclass
class Run:
    """One simulator run as the report sees it."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    options: dict[str, Any]
    records: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    partial: bool = False
    """The run has not ended: no summary.json (still going, or killed), or one saying a signal or an exception
    stopped it (:func:`stopped_early`); counts come from metrics.jsonl."""

    # ---------------------------------------------------------------- identity
    @property
    def name(self) -> str:
        return self.path.name

    @property
    def strategy(self) -> str:
        if self.summary.get("strategy"):
            return str(self.summary["strategy"])
        for r in self.records:
            if r.get("kind") == "recovery" and r.get("strategy"):
                return str(r["strategy"])
        return canonical_name(str(self.options.get("setting", "?")), self.swaps)

    @property
    def swaps(self) -> bool:
        return bool(self.summary.get("swaps", self.options.get("swaps", False)))

    @property
    def label(self) -> str:
        """Strategy name, with "+swaps" when a non-CheckFree+ strategy ran with out-of-order swaps."""
        s = self.strategy
        return f"{s} +swaps" if self.swaps and s != "checkfree_plus" else s

    @property
    def rate(self) -> float:
        """Nominal stage failure rate in %/h (the P argument)."""
        return _num(self.summary.get("failure_rate_per_hour", self.options.get("rate")))

    @property
    def p_iter(self) -> float:
        """Per-iteration stage failure probability the run drew with (NaN when unknown)."""
        if "failure_probability" in self.summary:
            return _num(self.summary["failure_probability"])
        if self.options.get("failure_probability") is not None:
            return _num(self.options["failure_probability"])
        rate = self.rate
        key = str(int(rate)) if math.isfinite(rate) and rate.is_integer() else repr(rate)
        return _num(self.config.get(key))

    @property
    def config_name(self) -> str:
        return Path(str(self.summary.get("config", self.options.get("config", "?")))).stem

    @property
    def failure_seed(self) -> Any:
        seed = self.options.get("failure_seed")
        return self.config.get("seed") if seed is None else seed

    @property
    def world_size(self) -> int:
        return int(self.summary.get("world_size", self.options.get("world_size", 1)) or 1)

    @property
    def mb_count(self) -> int:
        return int(self.config.get("mb_count", 1) or 1)

    # ---------------------------------------------------------------- series
    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    @property
    def evals(self) -> list[tuple[int, float]]:
        """(wall-clock iteration, validation loss), in file order."""
        return [(int(r["iteration"]), _num(r.get("val_loss"))) for r in self.kind("eval") if "iteration" in r]

    @property
    def evals_by_effective(self) -> list[tuple[int, float]]:
        """(effective iteration, validation loss), in file order (a rollback makes an effective iteration repeat;
        a run that never rolls back has effective = wall-clock iterations)."""
        return [
            (int(r.get("effective_iteration", r["iteration"])), _num(r.get("val_loss")))
            for r in self.kind("eval")
            if "iteration" in r
        ]

    @property
    def final_eval(self) -> dict[str, float]:
        fe = self.summary.get("final_eval")
        if isinstance(fe, dict) and "val_loss" in fe:
            return {
                "iteration": _num(fe.get("iteration")),
                "val_loss": _num(fe["val_loss"]),
                "perplexity": _num(fe.get("perplexity")),
            }
        evals = self.kind("eval")
        if not evals:
            return {"iteration": math.nan, "val_loss": math.nan, "perplexity": math.nan}
        last = evals[-1]
        return {
            "iteration": _num(last.get("iteration")),
            "val_loss": _num(last.get("val_loss")),
            "perplexity": _num(last.get("perplexity")),
        }

    def count(self, key: str) -> int:
        """failures / recoveries / fallbacks: summary.json's value, else counted from metrics.jsonl."""
        if key in self.summary and not self.partial:
            return int(self.summary[key])
        if key == "failures":
            return len(self.kind("failure"))
        if key == "recoveries":
            return len(self.kind("recovery"))
        if key == "fallbacks":
            return sum(1 for r in self.kind("recovery") if r.get("fallback"))
        return 0

    @property
    def iterations(self) -> int:
        train = [int(r["iteration"]) for r in self.kind("train") if "iteration" in r]
        return int(self.summary.get("iterations", (max(train) + 1) if train else 0))

    def costs(self) -> RunCosts:
        summary = dict(self.summary, strategy=self.strategy, iterations=self.iterations)
        return RunCosts.from_records(
            self.records, summary, mb_count=self.mb_count, n_stages=int(self.config.get("n_stages", 1) or 1)
        )


@dataclass
class SwarmRun:
    """A swarm (throughput experiment) run directory: throughput.json, read defensively."""

    path: Path
    data: dict[str, Any]
    missing: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    def _first(self, *keys: str) -> Any:
        for k in keys:
            if k in self.data and self.data[k] is not None:
                return self.data[k]
        return None

    @property
    def setting(self) -> str:
        return str(self._first("setting", "strategy", "mode") or "?")

    @property
    def rate(self) -> Any:
        return self._first("rate", "failure_rate", "failure_rate_per_hour")

    @property
    def iteration_times(self) -> list[float]:
        """Per-iteration wall seconds (crash and recovery iterations included)."""
        raw = self._first(
            "iteration_seconds",
            "iteration_times",
            "iteration_wall_seconds",
            "per_iteration_seconds",
            "iteration_times_s",
        )
        if raw is None and isinstance(self.data.get("iterations"), list):
            raw = self.data["iterations"]  # checkfree.swarm.supervisor.results: rows with "wall_s"
        if isinstance(raw, dict):
            raw = list(raw.values())
        if isinstance(raw, list):
            values = (
                _num(next((x[k] for k in ("wall_s", "seconds", "wall_seconds") if k in x), None))
                if isinstance(x, dict)
                else _num(x)
                for x in raw
            )
            return [v for v in values if math.isfinite(v) and v > 0]
        return []

    @property
    def mean_iteration_seconds(self) -> float | None:
        """Mean of all iterations' wall seconds (recoveries included)."""
        v = _num(self._first("mean_iteration_s", "mean_iteration_seconds", "iteration_time"))
        if math.isfinite(v) and v > 0:
            return v
        times = self.iteration_times
        return sum(times) / len(times) if times else None

    @property
    def steady_iteration_seconds(self) -> float | None:
        """Iteration time without crash/recovery iterations (the timing model adds recoveries separately):
        ``mean_iteration_s_without_crashes``, else the median per-iteration time, else the mean."""
        v = _num(self._first("mean_iteration_s_without_crashes", "steady_iteration_seconds"))
        if math.isfinite(v) and v > 0:
            return v
        times = self.iteration_times
        if times:
            return statistics.median(times)
        v = _num(self._first("median_iteration_s"))
        return v if math.isfinite(v) and v > 0 else self.mean_iteration_seconds

    @property
    def iterations(self) -> Any:
        v = self._first("iterations_completed", "iterations", "completed_iterations")
        return len(v) if isinstance(v, list) else v

    @property
    def tokens_per_second(self) -> float | None:
        v = _num(self._first("tokens_per_s", "tokens_per_second", "tokens/s", "throughput_tokens_per_s"))
        return v if math.isfinite(v) else None

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """The ``crashes`` rows, as the one recovery record schema (:func:`checkfree.recovery.record.upgrade`)."""
        raw = self._first("crashes")
        return [upgrade(r, "swarm") for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []

    @property
    def recovery_latencies(self) -> list[float]:
        """Each recovered crash's ``latency_s`` (crash → serving, seconds)."""
        values = (_num(r.get(LATENCY_KEY)) for r in self.recoveries)
        return [v for v in values if math.isfinite(v)]

    @property
    def validation(self) -> list[dict[str, Any]]:
        """The run's validations in order (throughput.json ``validation``: ``iteration``, ``val_loss`` in nats,
        ``perplexity``; a diverged one's loss is NaN); [] for a run without (swarm runs before validation)."""
        raw = self.data.get("validation")
        rows = [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
        return [
            {
                "iteration": r.get("iteration"),
                "val_loss": _num(r.get("val_loss")),
                "perplexity": _num(r.get("perplexity")),
            }
            for r in rows
        ]

    @property
    def bytes_by_type(self) -> dict[str, float]:
        raw = self._first("bytes_sent_by_type", "bytes_by_type", "bytes_by_message_type", "bytes")
        if isinstance(raw, dict):
            return {str(k): _num(v) for k, v in raw.items() if math.isfinite(_num(v))}
        return {}

    def check(self) -> None:
        """Fill :attr:`missing` with the quantities the report looks for and could not find."""
        checks = {
            "per-iteration wall times": bool(self.iteration_times) or self.mean_iteration_seconds is not None,
            "iterations completed": self.iterations is not None,
            "tokens/s": self.tokens_per_second is not None,
            "crashes/recoveries": self._first("crashes") is not None,
            "bytes by message type": bool(self.bytes_by_type),
        }
        self.missing = [k for k, ok in checks.items() if not ok]
        if self.recoveries and not self.recovery_latencies:
            self.missing.append("recovery latency seconds")


def _drop_superseded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """After a "resume" at wall iteration r, records of the killed segment at iteration ≥ r are dropped."""
    out: list[dict[str, Any]] = []
    for r in records:
        if r.get("kind") == "resume":
            at = _num(r.get("iteration"))
            if math.isfinite(at):
                out = [x for x in out if not (_num(x.get("iteration")) >= at)]
        out.append(r)
    return out


def load_run(path: Path) -> Run | SwarmRun:
    """Read one run directory.

    Raises:
        RunDirError: not a directory, no metrics.jsonl/throughput.json, unreadable JSON, or no evaluation yet.
    """
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path} is not a directory.")
    if (path / "throughput.json").is_file():
        data = _read_json(path / "throughput.json", ThroughputRow)
        swarm = SwarmRun(path, data)
        swarm.check()
        return swarm
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise RunDirError(f"{path} has no metrics.jsonl or throughput.json; expected a run directory.")
    try:
        records = read_metrics(metrics)
    except ValueError as e:
        raise RunDirError(str(e)) from None
    except UnicodeDecodeError:
        raise RunDirError(f"{metrics} is not UTF-8 text.") from None
    warnings = []
    config = _read_json(path / "config.json") if (path / "config.json").is_file() else {}
    if not config:
        warnings.append("no config.json: the iteration-time formula cannot use this run's shape")
    options = _read_json(path / "options.json") if (path / "options.json").is_file() else {}
    summary_path = path / "summary.json"
    summary: dict[str, Any] = {}
    partial = not summary_path.is_file()
    if partial:
        warnings.append(
            "no summary.json: partial run (still running or killed); counts come from metrics.jsonl"
        )
    else:
        summary = _read_json(summary_path, Summary)
        if stopped_early(summary):
            partial = True
            warnings.append(
                f"summary.json says {summary.get('status')} ({summary.get('cause')}): partial run, not an outcome; "
                "counts come from metrics.jsonl"
            )
    if not isinstance(config, dict) or not isinstance(options, dict):
        raise RunDirError(f"{path}: config.json and options.json must be JSON objects.")
    records = [
        upgrade(r, "simulator") if r.get("kind") == "recovery" else r for r in _drop_superseded(records)
    ]
    train_its = [r.get("iteration") for r in records if r.get("kind") == "train"]
    dups = len(train_its) - len(set(train_its))
    if dups:
        warnings.append(
            f"metrics.jsonl repeats {dups} training iteration(s): two processes wrote to this "
            "directory? the first record of each is used"
        )
        seen: set[Any] = set()
        kept = []
        for r in records:
            key = (r.get("kind"), r.get("iteration"), r.get("stage"))
            if r.get("kind") in ("train", "eval", "failure", "recovery") and key in seen:
                continue
            seen.add(key)
            kept.append(r)
        records = kept
    run = Run(path, summary, config, options, records, warnings, partial)
    if not run.evals:
        raise RunDirError(f"{path} has no evaluation in metrics.jsonl yet; nothing to report.")
    return run


def expand(paths: list[Path]) -> list[Path]:
    """Run directories named by ``paths``: a directory that is not itself a run stands for its sub-directories."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        is_run = (p / "metrics.jsonl").exists() or (p / "throughput.json").exists()
        if p.is_dir() and not is_run:
            subs = sorted(c for c in p.iterdir() if c.is_dir() and not c.name.startswith("."))
            if subs:
                out.extend(subs)
                continue
        out.append(p)
    return out


def load_runs(paths: list[Path]) -> tuple[list[Run], list[SwarmRun], list[tuple[Path, str]]]:
    """Simulator runs, swarm runs, and (path, reason) of every directory skipped as malformed."""
    runs: list[Run] = []
    swarms: list[SwarmRun] = []
    skipped: list[tuple[Path, str]] = []
    for p in expand(paths):
        try:
            r = load_run(p)
        except RunDirError as e:
            log.debug("skipping %s: %s", p, e)  # the caller lists the skipped directories
            skipped.append((p, str(e)))
            continue
        (swarms if isinstance(r, SwarmRun) else runs).append(r)
    return runs, swarms, skipped
