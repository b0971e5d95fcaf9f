"""The report's "Trace replays" section: runs that replayed a real preemption trace.

A trace (Bamboo's or Parcae's, checkfree.failures.traces) is mapped onto stages × replicas slots and written as a
``checkfree-slot-downtime-v1`` schedule; a stage is *short of replicas* in an iteration where some but not all of
its slots are down, and *lost* in one where all are (docs/paper.md §1: only a whole-stage loss needs recovery).

- A **simulator run** replayed such a schedule when its summary.json holds ``short_of_replicas_iterations`` or
  ``all_replicas_down_iterations`` (stage → iteration count, checkfree.sim.launch.replica_shortage), or when its
  options' ``failure_schedule`` names a readable downtime schedule. The schedule file is looked for as written
  (relative to the current directory), then relative to the directory the run was launched from (recovered from
  options.json's ``run_dir``), then by its name inside the run directory and the two directories above it (an
  archive that keeps the schedule beside its runs, as benchmarks/results/trace_p3/ does).
- A **swarm run** replayed one when throughput.json's ``schedule.format`` is ``checkfree-slot-downtime-v1``; its
  ``replica_shortage`` (stage → short/waiting iterations and seconds, losses), ``waits``, ``crashes`` (with
  ``recovery_s``), ``mean_recovery_s`` and counts are read defensively: a missing or malformed value is shown as
  "—" (None in JSON), never fatal.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.failures.traces import DOWNTIME_FORMAT
from checkfree.report.runs import Run, SwarmRun

MAX_SCHEDULE_BYTES = 256 * 2**20
"""A schedule file larger than this is not read (the report then names the schedule by its file name)."""


def _num(value: Any) -> float | None:
    """A finite float, or None (booleans, strings, NaN and the rest are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _stage_sum(counts: Any) -> int | None:
    """Sum of a stage → count map's values (non-numbers ignored); None when ``counts`` is not a map."""
    if not isinstance(counts, dict):
        return None
    return int(sum(v for v in (_num(x) for x in counts.values()) if v is not None))


def _read_schedule(path: Path) -> dict[str, Any] | None:
    """The schedule file's JSON object, or None when it is missing, too large, unreadable or not an object."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_SCHEDULE_BYTES:
            return None
        data = jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return data if isinstance(data, dict) else None


def _schedule_name(source: Any, path: Any) -> str:
    """The trace file a schedule was mapped from (its ``source``), else the schedule file's name, else "—"."""
    trace = source.get("trace") if isinstance(source, dict) else None
    if isinstance(trace, str) and trace:
        return trace
    if isinstance(path, str) and path:
        return Path(path).name
    return "—"


def _candidates(run: Run, written: str) -> list[Path]:
    """Where the schedule ``written`` in options.json may be, most likely first (see the module docstring)."""
    p = Path(written)
    if p.is_absolute():
        return [p, run.path / p.name]
    out = [p]
    run_dir = run.options.get("run_dir")
    if isinstance(run_dir, str) and run_dir and not Path(run_dir).is_absolute():
        tail = Path(run_dir).parts
        here = run.path.resolve()
        if len(here.parts) > len(tail) and here.parts[-len(tail) :] == tail:
            out.append(here.parents[len(tail) - 1] / p)  # the directory the run was launched from
    out += [run.path / p.name, run.path.parent / p.name, run.path.parent.parent / p.name]  # an archived copy
    return out


@dataclass
class SimulatorTraceRow:
    """One simulator run that replayed a downtime schedule. Counts are over the run's iterations (None: unknown)."""

    run: str
    setting: str
    partial: bool
    schedule: str
    """The trace the schedule was mapped from (its ``source.trace``), else the schedule file's name."""
    schedule_path: str | None
    stage_losses: int
    """Stage failures the run injected: one per iteration in which a stage's last replica went down."""
    short_of_replicas_iterations: int | None
    """Sum over stages of the iterations in which some but not all of the stage's replicas were down."""
    all_replicas_down_iterations: int | None
    """Sum over stages of the iterations in which all of the stage's replicas were down."""
    final_val_loss: float | None
    perplexity: float | None


@dataclass
class SwarmTraceRow:
    """One swarm run that replayed a downtime schedule (throughput.json; None: not recorded)."""

    run: str
    setting: str
    schedule: str
    iterations_completed: int | None
    stage_losses: int | None
    """Sum over stages of ``replica_shortage[stage].losses``: times a stage lost its last replica."""
    short_of_replicas_s: float | None
    """Sum over stages of ``short_s``: stage-seconds a stage served with fewer than all its replicas."""
    waiting_s: float | None
    """Sum over stages of ``waiting_s``: stage-seconds the pipeline waited for a stage with no replica."""
    waits: int | None
    """Entries of ``waits``: iterations the pipeline waited for a lost stage to come back."""
    mean_crash_to_serving_s: float | None
    mean_recovery_s: float | None
    """Mean of the crashes' ``recovery_s``: the node's return (or its replacement's spawn) → serving."""
    crashes: int | None
    recovered: int | None
    every_loss_recovered: bool | None
    tokens_per_s: float | None
    held_down: int = 0
    """Open crashes whose slot the schedule kept down to the end of the run (``down_until`` in the record): not
    a failed recovery, the trace brought no node back in time."""


@dataclass
class TraceReplays:
    """The rows of the "Trace replays" section (both lists empty: no run replayed a trace)."""

    simulator: list[SimulatorTraceRow] = dataclasses.field(default_factory=list)
    swarm: list[SwarmTraceRow] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.simulator or self.swarm)

    def to_json(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "simulator": [dataclasses.asdict(r) for r in self.simulator],
            "swarm": [dataclasses.asdict(r) for r in self.swarm],
        }


def simulator_row(
    run: Run, cache: dict[Path, dict[str, Any] | None] | None = None
) -> SimulatorTraceRow | None:
    """The row of a simulator run that replayed a downtime schedule, else None. ``cache``: schedule file → its
    JSON, shared between runs of the same schedule."""
    cache = {} if cache is None else cache
    written = run.options.get("failure_schedule")
    schedule: dict[str, Any] | None = None
    found: Path | None = None
    if isinstance(written, str) and written:
        for candidate in _candidates(run, written):
            if candidate not in cache:
                cache[candidate] = _read_schedule(candidate)
            if cache[candidate] is not None:
                schedule, found = cache[candidate], candidate
                break
    downtime = schedule is not None and schedule.get("format") == DOWNTIME_FORMAT
    short = _stage_sum(run.summary.get("short_of_replicas_iterations"))
    lost = _stage_sum(run.summary.get("all_replicas_down_iterations"))
    if not downtime and short is None and lost is None:
        return None
    name = _schedule_name(schedule.get("source") if schedule is not None else None, written)
    fe = run.final_eval
    return SimulatorTraceRow(
        run=run.name,
        setting=run.label,
        partial=run.partial,
        schedule=name,
        schedule_path=str(found) if found is not None else (written if isinstance(written, str) else None),
        stage_losses=run.count("failures"),
        short_of_replicas_iterations=short,
        all_replicas_down_iterations=lost,
        final_val_loss=_num(fe["val_loss"]),
        perplexity=_num(fe["perplexity"]),
    )


def _shortage_sum(shortage: Any, key: str) -> float | None:
    if not isinstance(shortage, dict):
        return None
    values = [_num(v.get(key)) for v in shortage.values() if isinstance(v, dict)]
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def _count(value: Any) -> int | None:
    v = _num(value)
    return int(v) if v is not None else None


def swarm_row(swarm: SwarmRun) -> SwarmTraceRow | None:
    """The row of a swarm run whose throughput.json says it replayed a downtime schedule, else None."""
    data = swarm.data
    schedule = data.get("schedule")
    if not isinstance(schedule, dict) or schedule.get("format") != DOWNTIME_FORMAT:
        return None
    name = _schedule_name(schedule.get("source"), schedule.get("path"))
    shortage = data.get("replica_shortage")
    losses = _shortage_sum(shortage, "losses")
    crashes = _dicts(data.get("crashes"))
    n_crashes = _count(data.get("crashes_count"))
    if isinstance(data.get("crashes"), list):
        # "crashes" holds the recovered ones, "open_crashes" those whose slot never served again
        seen = len(crashes) + len(_dicts(data.get("open_crashes")))
        n_crashes = seen if n_crashes is None else max(n_crashes, seen)
    held_down = sum(1 for c in _dicts(data.get("open_crashes")) if "down_until" in c)
    recovered = _count(data.get("recovered_count"))
    if recovered is None and isinstance(data.get("crashes"), list):
        recovered = sum(1 for c in crashes if _num(c.get("latency_s")) is not None)
    serving = _num(data.get("mean_crash_to_serving_s"))
    if serving is None and swarm.recovery_latencies:
        serving = statistics.mean(swarm.recovery_latencies)
    recovery = _num(data.get("mean_recovery_s"))
    if recovery is None:
        rs = [v for v in (_num(c.get("recovery_s")) for c in crashes) if v is not None]
        recovery = statistics.mean(rs) if rs else None
    waits = data.get("waits")
    return SwarmTraceRow(
        run=swarm.name,
        setting=swarm.setting,
        schedule=name,
        iterations_completed=_count(swarm.iterations),
        stage_losses=int(losses) if losses is not None else None,
        short_of_replicas_s=_shortage_sum(shortage, "short_s"),
        waiting_s=_shortage_sum(shortage, "waiting_s"),
        waits=len(waits) if isinstance(waits, list) else None,
        mean_crash_to_serving_s=serving,
        mean_recovery_s=recovery,
        crashes=n_crashes,
        recovered=recovered,
        every_loss_recovered=None
        if n_crashes is None or recovered is None
        else recovered + held_down >= n_crashes,
        held_down=held_down,
        tokens_per_s=swarm.tokens_per_second,
    )


def collect(runs: list[Run], swarms: list[SwarmRun]) -> TraceReplays:
    """The trace-replay rows of ``runs`` and ``swarms``, in their order (each schedule file is read once)."""
    cache: dict[Path, dict[str, Any] | None] = {}
    sim = [r for r in (simulator_row(run, cache) for run in runs) if r is not None]
    sw = [r for r in (swarm_row(s) for s in swarms) if r is not None]
    return TraceReplays(sim, sw)


def _f(value: float | int | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def section(traces: TraceReplays) -> list[str]:
    """The "Trace replays" Markdown section; empty when no run replayed a downtime schedule."""
    if not traces:
        return []
    lines = [
        "## Trace replays",
        "",
        "Runs that replayed a real preemption trace mapped onto stages × replicas "
        "(`checkfree-slot-downtime-v1`, checkfree/failures/traces.py): a stage is short of replicas while some "
        "but not all of its replicas are down, and lost while all are.",
        "",
    ]
    if traces.simulator:
        lines += [
            "Simulator runs:",
            "",
            "- *schedule*: the trace file the schedule was mapped from, else the schedule file's name.",
            "- *stage losses*: stage failures the run injected, one each time a stage's last replica went down.",
            "- *iterations short of replicas*: iterations in which a stage ran on fewer than all its replicas, "
            "summed over stages.",
            "- *iterations with a stage lost*: iterations in which a stage had no replica, summed over stages.",
            "- *final val loss* and *perplexity*: the last evaluation's validation loss (nats) and its exp.",
            "",
        ]
        body = [
            [
                f"{r.setting}{' [partial]' if r.partial else ''} <br>`{r.run}`",
                f"`{r.schedule}`",
                str(r.stage_losses),
                _f(r.short_of_replicas_iterations, "d"),
                _f(r.all_replicas_down_iterations, "d"),
                _f(r.final_val_loss, ".4f"),
                _f(r.perplexity, ".2f"),
            ]
            for r in traces.simulator
        ]
        lines += _table(
            [
                "setting",
                "schedule",
                "stage losses",
                "iterations short of replicas",
                "iterations with a stage lost",
                "final val loss",
                "perplexity",
            ],
            body,
        ) + [""]
    if traces.swarm:
        lines += [
            "Swarm runs:",
            "",
            "- *iterations*: iterations completed.",
            "- *stage losses*: times a stage lost its last replica, summed over stages.",
            "- *short of replicas s*: seconds a stage served with fewer than all its replicas, summed over stages.",
            "- *waiting s*: seconds the pipeline waited for a stage with no replica, summed over stages "
            "(the number of waits in brackets).",
            "- *mean crash→serving s*: mean seconds from a node's crash until its slot serves again.",
            "- *mean recovery s*: mean seconds from the node's return (or its replacement's start) until it serves.",
            "- *every loss recovered*: whether every crashed node's slot served again by the end (recovered of "
            "crashes, the crashes still open when the run ended included), except slots the trace kept down to "
            "the run's end.",
            "- *tokens/s*: training tokens per second over the whole run.",
            "",
        ]
        body = []
        for r in traces.swarm:
            if r.every_loss_recovered is None:
                recovered = "—"
            else:
                recovered = f"{'yes' if r.every_loss_recovered else 'no'} ({r.recovered} of {r.crashes}"
                recovered += f"; {r.held_down} kept down by the trace to its end)" if r.held_down else ")"
            waiting = _f(r.waiting_s, ".1f") + (f" ({r.waits} waits)" if r.waits is not None else "")
            body.append(
                [
                    f"{r.setting} <br>`{r.run}`",
                    f"`{r.schedule}`",
                    _f(r.iterations_completed, "d"),
                    _f(r.stage_losses, "d"),
                    _f(r.short_of_replicas_s, ".1f"),
                    waiting,
                    _f(r.mean_crash_to_serving_s, ".2f"),
                    _f(r.mean_recovery_s, ".2f"),
                    recovered,
                    _f(r.tokens_per_s, ".1f"),
                ]
            )
        lines += _table(
            [
                "setting",
                "schedule",
                "iterations",
                "stage losses",
                "short of replicas s",
                "waiting s",
                "mean crash→serving s",
                "mean recovery s",
                "every loss recovered",
                "tokens/s",
            ],
            body,
        ) + [""]
    return lines


__all__ = [
    "SimulatorTraceRow",
    "SwarmTraceRow",
    "TraceReplays",
    "collect",
    "section",
    "simulator_row",
    "swarm_row",
]
