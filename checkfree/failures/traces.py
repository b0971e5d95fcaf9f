"""Real preemption traces → a schedule of slot down intervals (``checkfree-slot-downtime-v1``).

Real preemptions are not the Bernoulli draws of paper §5: they come in bursts, a preempted machine stays away for
minutes to hours, and a stage runs on fewer replicas until a spare arrives; it is lost only when its last replica
goes (docs/paper.md §1: a partial failure is trivial, a whole-stage failure is what CheckFree recovers). Two public
trace formats are read:

- ``bamboo`` (Bamboo, Thorpe et al., NSDI'23, ``traces/p3-trace.csv``): one event per line,
  ``milliseconds,add|remove,nodeK``.
- ``parcae`` (Parcae, Duan et al., NSDI'24, ``aws/traces/<model>/trace_*.txt``): one JSON list per line,
  ``[milliseconds, "add"|"remove"|"no-op", {"nodes": [names...], ...}]``.

**Mapping rule** (:func:`map_trace`). The swarm has ``stages × replicas`` slots for the transformer stages 1..S
(stage 0, the embedding and head, is not driven by the trace, as in the authors' schedules); slot ``(s, r)`` is
swarm node id ``s · replicas + r``. Events are applied in time order:

- an added node fills an empty slot of the *emptiest* stage (fewest live replicas; ties: the lowest stage, then
  the lowest replica index), as SWARM parallelism rebalances; when no slot is empty it waits as a spare (FIFO);
- a removed node empties its slot, and the oldest spare, if any, at once fills the emptiest stage's empty slot;
  a removed spare just leaves the pool.

A slot is *down* from the iteration its node left until the iteration a node fills it again; an interval
``[k, k]`` (left and refilled within iteration ``k``) is a crash with an immediate replacement, as in the
authors' schedules. Times map to iterations as ``⌊(t − start) / iteration_seconds⌋``.

**Losses** (:meth:`DowntimeSchedule.stage_losses`): a slot counts as down during iterations
``[down, max(up, down + 1))``; a stage is *short of replicas* in an iteration where some but not all of its slots
are down, and *lost* in one where all are; a loss event is the first iteration of each run of lost iterations,
i.e. the iteration its last replica went down.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.schemas.limits import MAX_SCHEDULE_BYTES, check_json_depth, load_json

DOWNTIME_FORMAT = "checkfree-slot-downtime-v1"
TRACE_FORMATS = ("bamboo", "parcae")
MAX_TRACE_BYTES = 64 * 2**20
"""A trace larger than this is refused before it is read (the public traces are a few KB)."""
MAX_ITERATIONS = 1_000_000
"""The longest schedule a trace may map to (hours × 3600 / iteration_seconds)."""


@dataclass(frozen=True)
class TraceEvent:
    """One node joining or leaving the pool.

    Attributes:
        ms: time since the trace's start, in milliseconds.
        kind: ``"add"`` or ``"remove"``.
        node: the trace's name of the machine.
        line: 1-based line of the trace file (for error messages).
    """

    ms: int
    kind: str
    node: str
    line: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def detect_format(text: str) -> str:
    """``"bamboo"`` or ``"parcae"`` from the first non-empty line; raises ValueError if it is neither."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("["):
            return "parcae"
        if line.count(",") == 2:
            return "bamboo"
        break
    raise ValueError(
        "the trace's first line is neither a Bamboo event ('ms,add|remove,node') nor a Parcae JSON list; "
        "expected one of those formats (or name it with --trace-format)."
    )


def _bamboo_events(text: str, where: str) -> Iterable[TraceEvent]:
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in ("add", "remove") or not parts[2]:
            raise ValueError(f"{where} line {n}: {line[:80]!r} is not 'milliseconds,add|remove,node'.")
        yield TraceEvent(int(parts[0]), parts[1], parts[2], n)


def _parcae_events(text: str, where: str) -> Iterable[TraceEvent]:
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        try:
            check_json_depth(line, f"{where} line {n}")
            item = json.loads(line)
        except json.JSONDecodeError:
            raise ValueError(f"{where} line {n} is not valid JSON: expected [ms, kind, {{...}}].") from None
        ok = (
            isinstance(item, list)
            and len(item) >= 3
            and _is_int(item[0])
            and item[0] >= 0
            and item[1] in ("add", "remove", "no-op")
            and isinstance(item[2], dict)
            and isinstance(item[2].get("nodes", []), list)
            and all(isinstance(x, str) and x for x in item[2].get("nodes", []))
        )
        if not ok:
            raise ValueError(
                f'{where} line {n}: expected [milliseconds ≥ 0, "add"|"remove"|"no-op", '
                '{"nodes": [names...]}].'
            )
        if item[1] == "no-op":
            continue
        for node in item[2].get("nodes", []):
            yield TraceEvent(item[0], item[1], node, n)


def read_trace(path: str | Path, fmt: str | None = None) -> tuple[list[TraceEvent], str]:
    """Read and validate a preemption trace.

    Args:
        path: a Bamboo CSV or a Parcae JSON-lines file.
        fmt: ``"bamboo"``, ``"parcae"`` or None to detect it from the first line.

    Returns:
        (events in time order, the format read).

    Raises:
        FileNotFoundError: no such file.
        ValueError: one sentence naming the file, the line and what was expected: an unknown format, a malformed
            line, a timestamp before the previous one, an add of a node already in the pool, a removal of a node
            not in the pool (never added, or already removed), or no event at all.
    """
    path = Path(path)
    where = f"trace {str(path)!r}"
    if not path.is_file():
        raise FileNotFoundError(f"{where} does not exist: expected a Bamboo or Parcae trace file.")
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{where} is {path.stat().st_size} bytes: expected at most {MAX_TRACE_BYTES}.")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{where} is not text: expected a Bamboo CSV or Parcae JSON lines.") from None
    if not text.strip():
        raise ValueError(f"{where} holds no add or remove event; expected at least one.")
    if fmt is None:
        try:
            fmt = detect_format(text)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"trace format {fmt!r} is unknown; expected one of {', '.join(TRACE_FORMATS)}.")
    parse = _bamboo_events if fmt == "bamboo" else _parcae_events
    events: list[TraceEvent] = []
    alive: set[str] = set()
    for ev in parse(text, where):
        if events and ev.ms < events[-1].ms:
            raise ValueError(
                f"{where} line {ev.line}: time {ev.ms} ms is before the previous event's {events[-1].ms} ms; "
                "expected events in time order."
            )
        if ev.kind == "add":
            if ev.node in alive:
                raise ValueError(f"{where} line {ev.line}: adds {ev.node!r}, which is already in the pool.")
            alive.add(ev.node)
        else:
            if ev.node not in alive:
                raise ValueError(
                    f"{where} line {ev.line}: removes {ev.node!r}, which is not in the pool (never added, or "
                    "already removed); expected a removal of a live node."
                )
            alive.discard(ev.node)
        events.append(ev)
    if not events:
        raise ValueError(f"{where} holds no add or remove event; expected at least one.")
    return events, fmt


Interval = tuple[int, int | None]
"""(iteration the slot went down, iteration it came back; None = not back within the schedule)."""


@dataclass
class DowntimeSchedule:
    """Per-slot down intervals of the transformer stages 1..S (format ``checkfree-slot-downtime-v1``).

    Attributes:
        stages: transformer stages S (stage 0 never goes down).
        replicas: replicas per stage R; slot ``(s, r)`` is swarm node id ``s · R + r``.
        iterations: length of the schedule (iterations 0..iterations−1).
        iteration_seconds: seconds one iteration stands for.
        slots: node id → ascending, non-overlapping down intervals.
        source: where it came from (trace file, format, sha256, window, mapping rule).
    """

    stages: int
    replicas: int
    iterations: int
    iteration_seconds: float
    slots: dict[int, list[Interval]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def slot_ids(self, stage: int) -> list[int]:
        """The swarm node ids of ``stage``'s slots."""
        return [stage * self.replicas + r for r in range(self.replicas)]

    def _down_counts(self, stage: int) -> list[int]:
        """(iterations,) how many of ``stage``'s slots are down in each iteration (the module docstring's rule)."""
        counts = [0] * self.iterations
        for node in self.slot_ids(stage):
            down = [False] * self.iterations
            for d, up in self.slots.get(node, []):
                end = self.iterations if up is None else min(max(up, d + 1), self.iterations)
                down[d:end] = [True] * max(0, end - d)
            for k, is_down in enumerate(down):
                counts[k] += is_down
        return counts

    def short_iterations(self, stage: int) -> list[int]:
        """Iterations in which ``stage`` ran on some but not all of its replicas."""
        return [k for k, n in enumerate(self._down_counts(stage)) if 0 < n < self.replicas]

    def lost_iterations(self, stage: int) -> list[int]:
        """Iterations in which every replica of ``stage`` was down."""
        return [k for k, n in enumerate(self._down_counts(stage)) if n == self.replicas]

    def iterations_with_every_stage(self) -> int:
        """Iterations in which no stage has all its replicas down."""
        lost: set[int] = set()
        for stage in range(1, self.stages + 1):
            lost.update(self.lost_iterations(stage))
        return self.iterations - len(lost)

    def stage_losses(self) -> list[tuple[int, int]]:
        """(iteration, stage) of every whole-stage loss: the first iteration of each run of lost iterations."""
        out = []
        for stage in range(1, self.stages + 1):
            previous = -2
            for k in self.lost_iterations(stage):
                if k != previous + 1:
                    out.append((k, stage))
                previous = k
        return sorted(out)

    def node_crashes(self) -> dict[int, list[int]]:
        """Node id → the iterations at which it goes down (the crash iterations the swarm replays)."""
        return {node: [d for d, _ in ivs] for node, ivs in sorted(self.slots.items()) if ivs}

    def back_at(self, node: int, down: int) -> int | None:
        """The iteration the slot ``node`` that went down at ``down`` comes back (None: not within the schedule).

        Raises:
            KeyError: the slot has no interval starting at ``down``.
        """
        for d, up in self.slots.get(node, []):
            if d == down:
                return up
        raise KeyError(f"slot {node} does not go down at iteration {down}")

    def to_json(self) -> dict[str, Any]:
        return {
            "format": DOWNTIME_FORMAT,
            "stages": self.stages,
            "replicas": self.replicas,
            "iterations": self.iterations,
            "iteration_seconds": self.iteration_seconds,
            "source": self.source,
            "slots": {str(n): [[d, u] for d, u in ivs] for n, ivs in sorted(self.slots.items()) if ivs},
        }

    def describe(self) -> str:
        """Per stage: how many iterations it was short of replicas, and when it was lost (one line each)."""
        lines = [
            f"{self.stages} stages × {self.replicas} replicas, {self.iterations} iterations of "
            f"{self.iteration_seconds:g} s ({self.iterations * self.iteration_seconds / 3600:.2f} h); "
            f"{sum(len(v) for v in self.slots.values())} slot outages, {len(self.stage_losses())} stage losses; "
            f"{self.iterations_with_every_stage()} iterations with every stage alive (what a swarm replaying "
            "the whole window trains at least: it waits out the others)"
        ]
        for stage in range(1, self.stages + 1):
            short = self.short_iterations(stage)
            lost = self.lost_iterations(stage)
            runs = _runs(lost)
            lost_text = ", ".join(f"{a}–{b}" if a != b else f"{a}" for a, b in runs) or "never"
            lines.append(
                f"stage {stage}: short of replicas in {len(short)} iterations ({_ranges(short)}); "
                f"lost {len(runs)} times ({lost_text})"
            )
        return "\n".join(lines)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def _ranges(values: list[int], limit: int = 6) -> str:
    runs = _runs(values)
    text = ", ".join(f"{a}–{b}" if a != b else f"{a}" for a, b in runs[:limit])
    if len(runs) > limit:
        text += f", … {len(runs) - limit} more"
    return text or "none"


def _check_positive_int(value: Any, what: str) -> None:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{what} is {value!r}; expected a positive integer.")


def map_trace(
    events: list[TraceEvent],
    stages: int,
    replicas: int,
    iteration_seconds: float,
    start_hours: float = 0.0,
    hours: float | None = None,
    source: dict[str, Any] | None = None,
) -> DowntimeSchedule:
    """Map trace events to slot down intervals by the module docstring's rule (emptiest stage first, spares FIFO).

    Args:
        events: validated events in time order (:func:`read_trace`).
        stages: transformer stages S ≥ 1; replicas: R ≥ 1 per stage.
        iteration_seconds: seconds per iteration (> 0).
        start_hours: where in the trace iteration 0 begins; events before it set the pool at the start.
        hours: length of the window (default: to the trace's last event).
        source: recorded in the schedule (file, format, sha256).

    Raises:
        ValueError: a parameter out of range, or a window that maps to no iteration or to more than
            :data:`MAX_ITERATIONS`.
    """
    _check_positive_int(stages, "stages")
    _check_positive_int(replicas, "replicas")
    for value, what in ((iteration_seconds, "iteration_seconds"), (start_hours, "start_hours")):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{what} is {value!r}; expected a finite number ≥ 0.")
    if iteration_seconds <= 0:
        raise ValueError(f"iteration_seconds is {iteration_seconds!r}; expected a number > 0.")
    start_s = start_hours * 3600.0
    last_s = events[-1].ms / 1000.0 if events else 0.0
    if hours is None:
        hours = max(0.0, (last_s - start_s) / 3600.0)
    if not isinstance(hours, (int, float)) or not math.isfinite(hours) or hours <= 0:
        raise ValueError(f"hours is {hours!r}; expected a number > 0 (the window after --start-hours).")
    n_iter = math.ceil(hours * 3600.0 / iteration_seconds)
    if not 1 <= n_iter <= MAX_ITERATIONS:
        raise ValueError(
            f"{hours} h at {iteration_seconds} s per iteration is {n_iter} iterations; expected 1..{MAX_ITERATIONS}."
        )
    end_s = start_s + hours * 3600.0

    n_slots = stages * replicas
    occupant: list[str | None] = [None] * n_slots  # slot index (s − 1) · R + r
    where: dict[str, int] = {}
    spares: list[str] = []
    ever_filled = [False] * n_slots
    down_since: list[int | None] = [0] * n_slots  # a slot is down until a node first fills it
    intervals: list[list[Interval]] = [[] for _ in range(n_slots)]

    def emptiest_slot() -> int | None:
        best: tuple[int, int] | None = None
        for s in range(stages):
            n = sum(occupant[s * replicas + r] is not None for r in range(replicas))
            if n < replicas and (best is None or n < best[0]):
                best = (n, s)
        if best is None:
            return None
        return next(
            best[1] * replicas + r for r in range(replicas) if occupant[best[1] * replicas + r] is None
        )

    def fill(node: str, it: int, in_window: bool) -> bool:
        slot = emptiest_slot()
        if slot is None:
            return False
        occupant[slot], where[node] = node, slot
        down = down_since[slot]
        if in_window and down is not None and (ever_filled[slot] or it > 0):
            intervals[slot].append((down, it))
        ever_filled[slot], down_since[slot] = True, None
        return True

    for ev in events:
        t = ev.ms / 1000.0
        if t >= end_s:
            break
        in_window = t >= start_s
        it = math.floor((t - start_s) / iteration_seconds) if in_window else 0
        if ev.kind == "add":
            if not fill(ev.node, it, in_window):
                spares.append(ev.node)
        elif ev.node in where:
            slot = where.pop(ev.node)
            occupant[slot] = None
            if intervals[slot] and intervals[slot][-1][1] == it:
                down_since[slot] = intervals[slot].pop()[0]  # down again in the iteration it came back
            else:
                down_since[slot] = it
            if spares:
                fill(spares.pop(0), it, in_window)
        else:
            spares.remove(ev.node)
    for slot in range(n_slots):
        if down_since[slot] is not None:
            intervals[slot].append((down_since[slot], None))
    slots: dict[int, list[Interval]] = {}
    for slot, ivs in enumerate(intervals):
        if ivs:
            s, r = divmod(slot, replicas)
            slots[(s + 1) * replicas + r] = ivs
    info = dict(source or {})
    info.update(
        {"rule": "emptiest stage first, spares FIFO", "start_hours": start_hours, "hours": round(hours, 6)}
    )
    return DowntimeSchedule(stages, replicas, n_iter, float(iteration_seconds), slots, info)


def schedule_from_trace(
    path: str | Path,
    stages: int,
    replicas: int,
    iteration_seconds: float,
    start_hours: float = 0.0,
    hours: float | None = None,
    fmt: str | None = None,
) -> DowntimeSchedule:
    """:func:`read_trace` then :func:`map_trace`, recording the file's name, format and sha256 as the source."""
    events, fmt = read_trace(path, fmt)
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return map_trace(
        events,
        stages,
        replicas,
        iteration_seconds,
        start_hours,
        hours,
        {"trace": Path(path).name, "trace_format": fmt, "sha256": digest},
    )


def parse_downtime(data: Any, where: str) -> DowntimeSchedule:
    """Validate a ``checkfree-slot-downtime-v1`` object (parsed JSON) into a :class:`DowntimeSchedule`.

    Raises:
        ValueError: one sentence naming ``where`` and the bad field: a wrong format, non-positive sizes, no
            ``slots`` (``{}`` is a schedule in which nothing goes down), a node id outside the transformer
            stages' slots, or intervals that are not ascending, non-overlapping pairs inside 0..iterations.
    """
    if not isinstance(data, dict) or data.get("format") != DOWNTIME_FORMAT:
        raise ValueError(f"{where} is not a {DOWNTIME_FORMAT!r} schedule.")
    for key in ("stages", "replicas", "iterations"):
        if not _is_int(data.get(key)) or data[key] < 1:
            raise ValueError(f"{where}: {key!r} is {data.get(key)!r}; expected a positive integer.")
    t = data.get("iteration_seconds")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t <= 0:
        raise ValueError(f"{where}: 'iteration_seconds' is {t!r}; expected a number > 0.")
    stages, replicas, n_iter = data["stages"], data["replicas"], data["iterations"]
    if "slots" not in data:
        raise ValueError(
            f"{where} has no 'slots'; expected an object {{\"node id\": [[down, up], ...]}} "
            "(an empty one when no slot goes down)."
        )
    slots_in = data["slots"]
    if not isinstance(slots_in, dict):
        raise ValueError(f"{where}: 'slots' must be an object {{\"node id\": [[down, up], ...]}}.")
    slots: dict[int, list[Interval]] = {}
    lo, hi = replicas, (stages + 1) * replicas - 1
    for key, ivs in slots_in.items():
        if not (isinstance(key, str) and key.isdigit() and lo <= int(key) <= hi):
            raise ValueError(
                f"{where}: slot {key!r} is not a transformer-stage node id; expected {lo}..{hi} "
                f"({stages} stages × {replicas} replicas, stage 0's nodes never go down)."
            )
        if not isinstance(ivs, list):
            raise ValueError(f"{where}: slot {key}: expected a list of [down, up] pairs.")
        parsed: list[Interval] = []
        for iv in ivs:
            ok = (
                isinstance(iv, list)
                and len(iv) == 2
                and _is_int(iv[0])
                and 0 <= iv[0] < n_iter
                and (iv[1] is None or _is_int(iv[1]) and iv[0] <= iv[1] <= n_iter)
            )
            if not ok or (parsed and (parsed[-1][1] is None or iv[0] <= parsed[-1][1])):
                raise ValueError(
                    f"{where}: slot {key}: {iv!r} is not a [down, up] pair with 0 ≤ down ≤ up ≤ {n_iter} "
                    "(up null = not back), after the end of the slot's previous interval."
                )
            parsed.append((iv[0], iv[1]))
        slots[int(key)] = parsed
    source = data.get("source", {})
    return DowntimeSchedule(
        stages, replicas, n_iter, float(t), slots, source if isinstance(source, dict) else {}
    )


def load_downtime(path: str | Path) -> DowntimeSchedule:
    """Read a ``checkfree-slot-downtime-v1`` file (see :func:`parse_downtime` for the errors)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"schedule {str(path)!r} does not exist: expected a JSON file.")
    # at most 16 MiB and 32 deep (checkfree.schemas.limits): one sentence, never a RecursionError
    data = load_json(path, "schedule", MAX_SCHEDULE_BYTES)
    return parse_downtime(data, f"schedule {str(path)!r}")


def save_downtime(path: str | Path, schedule: DowntimeSchedule) -> None:
    """Write the schedule as indented JSON (one slot per line)."""
    data = schedule.to_json()
    slots = data.pop("slots")
    head = jsonio.dumps(data, indent=1)[:-2]
    body = ",\n".join(f"  {jsonio.dumps(k)}: {jsonio.dumps(v)}" for k, v in slots.items())
    Path(path).write_text(head + ',\n "slots": {\n' + body + "\n }\n}\n")


__all__ = [
    "DOWNTIME_FORMAT",
    "TRACE_FORMATS",
    "DowntimeSchedule",
    "TraceEvent",
    "load_downtime",
    "map_trace",
    "parse_downtime",
    "read_trace",
    "save_downtime",
    "schedule_from_trace",
]
