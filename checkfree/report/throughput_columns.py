"""Issue 39's columns of a swarm run's throughput.json in words, for ``swarm table``
(checkfree.swarm.supervisor.results ``summary_table``) and the report (checkfree.report.markdown): aborted attempts,
microbatches re-sent and re-routes (summed over the iterations' rows), the within-run useful-work fraction, the
fail-slow nodes, and the last routing plan; and the useful-work fraction itself (:func:`useful_work_fraction`).
Older files lack these keys: their cells say "—".
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

log = logging.getLogger(__name__)


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _rows(result: dict[str, Any]) -> list[Any]:
    """The iterations' rows (an older file's ``iterations`` may be a count: no rows)."""
    rows = result.get("iterations")
    return rows if isinstance(rows, list) else []


SPEED_HEADERS = ("aborted attempts", "re-sent microbatches (re-routes)", "useful work", "fail-slow")
"""The headers of :func:`speed_cells`' cells."""


def speed_cells(result: dict[str, Any]) -> str:
    """Issue 39's columns of a run: aborted attempts, microbatches re-sent (re-routes), the useful-work fraction
    (within the run) and the fail-slow nodes, as Markdown cells ("—" where an older throughput.json lacks one)."""
    rows = [x for x in _rows(result) if isinstance(x, dict)]
    resent = sum(int(x.get("resent_microbatches", 0)) for x in rows)
    rerouted = sum(int(x.get("rerouted", 0)) for x in rows)
    aborted = result.get("aborted_attempts")
    slow = result.get("fail_slow")
    named = ", ".join(
        f"{x['node']} (stage {x['stage']}, {x['factor']:.1f}x @ {x['since']})" for x in slow or []
    )
    return (
        f"{'—' if aborted is None else aborted} | {resent} ({rerouted}) | "
        f"{_num(result.get('useful_work_fraction'), 2)} | {named or ('none' if slow is not None else '—')}"
    )


def plan_text(result: dict[str, Any]) -> str:
    """The last routing plan of a run in words ("" without one): per stage node:microbatches, then its bound, the
    plan's time and the fixed routes' time (seconds)."""
    rows = [x for x in _rows(result) if isinstance(x, dict) and x.get("routing_plan")]
    if not rows:
        return ""
    plan = rows[-1]["routing_plan"]
    stages = "; ".join(
        f"stage {st}: " + " ".join(f"{n}:{c}" for n, c in nodes.items())
        for st, nodes in plan["shares"].items()
    )
    return (
        f"iteration {rows[-1]['iteration']}: {stages}; bound {_num(plan['bound_s'])} s, plan {_num(plan['plan_s'])} s, "
        f"fixed routes {_num(plan['fixed_s'])} s"
    )


def useful_work_fraction(clean: list[float], walls: list[float]) -> float | None:
    """Mean of ``clean`` (the wall seconds of the iterations without a crash, recovered, open or rolled back, and
    without an aborted attempt) ÷ mean of ``walls`` (every committed iteration's): the within-run estimate of issue
    39's useful-work fraction, which divides the mean iteration of a crash-free run of the same command instead (a
    soak whose every iteration crashed has no clean one here: None, as for a zero mean)."""
    if not clean or not walls or statistics.mean(walls) <= 0:
        return None
    return statistics.mean(clean) / statistics.mean(walls)
