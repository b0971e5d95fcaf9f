"""Slowdown emulation (issue 39 point 4): which slots compute slower, by what factor, from which iteration.

A slot's factor ``f ≥ 1`` comes from the swarm config's ``slowdown`` (slot → factor, from iteration 0) and from the
``slowdowns`` events of a crash schedule in the node format::

    {"3": [12, 500], "slowdowns": [{"slot": 4, "factor": 3, "iteration": 10}]}

(slot 4 turns 3× slow at iteration 10; a later event of the same slot replaces its factor, factor 1 ends it). The
supervisor sends each attempt's factors with its ``begin`` (node id → factor of the slots' occupants, a replacement
inheriting its slot's), and a node of factor ``f`` sleeps ``(f − 1)`` × the measured seconds of each forward and
backward it computes (checkfree.swarm.node.compute ``StageWorker``), so factor 3 is three times as slow. It is an
emulation for tests and benches: the model's numbers do not change.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree.failures.schedules import SLOWDOWNS_KEY
from checkfree.schemas.limits import MAX_SCHEDULE_BYTES, load_json
from checkfree.swarm.config import MAX_SLOWDOWN

log = logging.getLogger(__name__)

MAX_EVENTS = 100_000


@dataclass(frozen=True)
class SlowEvent:
    """Slot ``slot`` computes ``factor`` × as slow from iteration ``iteration`` on."""

    slot: int
    factor: float
    iteration: int


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_slowdowns(data: Any, source: str, n_slots: int) -> list[SlowEvent]:
    """The ``slowdowns`` events of a schedule (``data``: the list, or None for none), sorted by iteration.

    Raises:
        ValueError: the list or an event is malformed, a slot is not one of ``0 .. n_slots − 1`` (the initial
            node ids) or a factor is outside [1, MAX_SLOWDOWN] (one sentence naming ``source``).
    """
    if data is None:
        return []
    if not (isinstance(data, list) and len(data) <= MAX_EVENTS):
        raise ValueError(
            f"{source}: 'slowdowns' is {str(data)[:60]!r}; expected a list of at most {MAX_EVENTS:,} "
            '{"slot": int, "factor": number, "iteration": int} objects.'
        )
    events = []
    for i, e in enumerate(data):
        ok = (
            isinstance(e, dict)
            and set(e) == {"slot", "factor", "iteration"}
            and _is_int(e["slot"])
            and _is_int(e["iteration"])
            and isinstance(e["factor"], (int, float))
            and not isinstance(e["factor"], bool)
        )
        if not ok:
            raise ValueError(
                f"{source}: slowdowns[{i}] is {str(e)[:60]!r}; expected "
                '{"slot": int, "factor": number, "iteration": int}.'
            )
        if not 0 <= e["slot"] < n_slots:
            raise ValueError(
                f"{source}: slowdowns[{i}] names slot {e['slot']}; expected slots 0..{n_slots - 1} "
                "(the initial node ids)."
            )
        if not 1.0 <= e["factor"] <= MAX_SLOWDOWN:  # NaN fails this too
            raise ValueError(
                f"{source}: slowdowns[{i}] has factor {e['factor']!r}; expected a number in [1, {MAX_SLOWDOWN:g}]."
            )
        if e["iteration"] < 0:
            raise ValueError(
                f"{source}: slowdowns[{i}] has iteration {e['iteration']}; expected an integer ≥ 0."
            )
        events.append(SlowEvent(e["slot"], float(e["factor"]), e["iteration"]))
    return sorted(events, key=lambda e: e.iteration)


def load_slowdowns(path: str | Path | None, n_slots: int) -> list[SlowEvent]:
    """The slowdown events of the node-format crash schedule at ``path`` (None, a schedule without ``slowdowns``
    or a down-interval schedule: none).

    Raises:
        ValueError: as :func:`parse_slowdowns`, or the file is not JSON. FileNotFoundError: no file.
    """
    if path is None:
        return []
    data = load_json(Path(path), "failure schedule", MAX_SCHEDULE_BYTES)
    if not isinstance(data, dict) or "format" in data:  # a down-interval schedule carries none
        return []
    return parse_slowdowns(data.get(SLOWDOWNS_KEY), f"failure schedule {str(path)!r}", n_slots)


class SlowdownPlan:
    """Each slot's factor at an iteration: the config's ``slowdown`` overridden by the events up to it.

    Args:
        config: slot (string key, as in the swarm config) → factor, or None. events: :func:`parse_slowdowns`'s.
    """

    def __init__(self, config: dict[str, float] | None = None, events: list[SlowEvent] | None = None) -> None:
        self.config = {int(k): float(v) for k, v in (config or {}).items()}
        self.events = sorted(events or [], key=lambda e: e.iteration)

    def factors(self, iteration: int) -> dict[int, float]:
        """Slot → factor at ``iteration`` (slots of factor 1 left out)."""
        out = dict(self.config)
        for e in self.events:
            if e.iteration > iteration:
                break
            out[e.slot] = e.factor
        return {s: f for s, f in sorted(out.items()) if f != 1.0}
