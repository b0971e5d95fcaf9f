"""The routing plan (issue 39 point 4; GWTF, arXiv 2509.21221, §4: microbatches routed by measured speed): how many
of the global batch's microbatches each serving node of each stage should carry so that all paths finish together.

Model. Stage ``s`` has serving nodes ``n`` with ``c_n`` seconds per microbatch (measured compute, forward +
backward, plus the link seconds of its microbatch's transfers); the global batch has ``M`` = pipelines ×
microbatches per pipeline microbatches, each of which visits one node of every stage. A node carrying ``x_n``
microbatches is busy ``x_n · c_n`` seconds, and in a pipelined iteration the busiest node sets the pace, so the plan
is the linear program

    minimise T  subject to  x_n · c_n ≤ T  (every node),  Σ_{n ∈ s} x_n = M  (every stage),  x_n ≥ 0,

solved with scipy's ``linprog`` (HiGHS). The stages share only T, so each stage's optimum is ``x_n ∝ 1/c_n``:
every node of a stage finishes together, at ``T_s = M / Σ_{n∈s} 1/c_n``, and the bound is ``T = max_s T_s`` (a
stage faster than the slowest could carry any split within T; the plan gives it its own equal-finish split too).
The integer plan rounds each stage's ``x`` by largest remainder (ties to the lower node id), so its counts add up
to ``M`` exactly. The fixed-route time is today's: pipeline ``p`` on the node of its replica slot
(checkfree.swarm.config.route, round-robin over a short stage), ``microbatches`` per pipeline.

The plan is computed and reported (throughput.json's ``routing_plan``), not applied to routes yet.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from checkfree.swarm.config import route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoutingPlan:
    """A stage → node → microbatches plan and the times it implies (seconds).

    ``shares``: stage → node → microbatch count (each stage's counts add up to the global batch).
    ``bound_s``: the iteration time the speeds allow (the LP's T: the slowest stage's seconds with fractional
    shares). ``plan_s``: the slowest node's seconds under the integer ``shares``. ``fixed_s``: the slowest node's
    seconds on today's fixed routes.
    """

    shares: dict[int, dict[int, int]]
    bound_s: float
    plan_s: float
    fixed_s: float

    def to_json(self) -> dict[str, object]:
        return {
            "shares": {str(s): {str(n): c for n, c in nodes.items()} for s, nodes in self.shares.items()},
            "bound_s": self.bound_s,
            "plan_s": self.plan_s,
            "fixed_s": self.fixed_s,
        }


def stage_shares(seconds: dict[int, float], total: int) -> tuple[dict[int, float], float]:
    """One stage's LP: node → seconds per microbatch (each > 0) and the microbatches ``total`` → node → fractional
    share (adding up to ``total``) and the stage's time T_s.

    Raises:
        ValueError: no node, a time that is not positive and finite, or the solver fails.
    """
    nodes = sorted(seconds)
    if not nodes:
        raise ValueError("a stage without serving nodes has no routing plan.")
    if not all(math.isfinite(seconds[n]) and seconds[n] > 0 for n in nodes):
        raise ValueError(f"seconds per microbatch {seconds}; expected positive finite numbers.")
    k = len(nodes)
    # variables: x_1 .. x_k, T; minimise T
    cost = np.zeros(k + 1)
    cost[-1] = 1.0
    a_ub = np.zeros((k, k + 1))
    for i, n in enumerate(nodes):
        a_ub[i, i], a_ub[i, -1] = seconds[n], -1.0  # x_n c_n - T <= 0
    a_eq = np.concatenate([np.ones(k), [0.0]])[None, :]
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(k), A_eq=a_eq, b_eq=[float(total)], method="highs")
    if not res.success:
        raise ValueError(f"the routing LP failed: {res.message}")
    return {n: float(res.x[i]) for i, n in enumerate(nodes)}, float(res.x[-1])


def largest_remainder(shares: dict[int, float], total: int) -> dict[int, int]:
    """Integer counts adding up to ``total``: each share's floor, then one more to the largest remainders (ties to
    the lower node id)."""
    counts = {n: math.floor(x + 1e-9) for n, x in shares.items()}
    left = total - sum(counts.values())
    by_remainder = sorted(shares, key=lambda n: (-(shares[n] - counts[n]), n))
    for n in by_remainder[: max(left, 0)]:
        counts[n] += 1
    return counts


def fixed_counts(
    members: dict[int, list[int]], pipelines: int, microbatches: int
) -> dict[int, dict[int, int]]:
    """Stage → node → microbatches on today's fixed routes (checkfree.swarm.config.route, stage order 1..S)."""
    stages = sorted(s for s in members if s != 0)
    out: dict[int, dict[int, int]] = {s: dict.fromkeys(members[s], 0) for s in members}
    for p in range(pipelines):
        path = route(p, members, len(stages), stages)
        if path is None:
            continue
        for s, n in zip([0, *stages], path, strict=True):
            out[s][n] += microbatches
    return out


def plan(
    seconds: dict[int, dict[int, float]],
    members: dict[int, list[int]],
    pipelines: int,
    microbatches: int,
) -> RoutingPlan:
    """The routing plan for stage → node → seconds per microbatch (every serving node of ``members`` with a
    measurement; a node without one gets its stage's median, or 1 s if none of the stage has one), for ``pipelines``
    pipelines of ``microbatches`` microbatches each.

    Raises:
        ValueError: a stage has no serving node, or a time is not positive and finite.
    """
    total = pipelines * microbatches
    shares: dict[int, dict[int, int]] = {}
    times: dict[int, dict[int, float]] = {}
    bound = 0.0
    for s in sorted(members):
        known = {n: seconds.get(s, {}).get(n) for n in members[s]}
        measured = sorted(v for v in known.values() if v is not None)
        fill = measured[len(measured) // 2] if measured else 1.0
        times[s] = {n: (v if v is not None else fill) for n, v in known.items()}
        fractional, t_s = stage_shares(times[s], total)
        shares[s] = largest_remainder(fractional, total)
        bound = max(bound, t_s)
    fixed = fixed_counts(members, pipelines, microbatches)
    plan_s = max((c * times[s][n] for s, nodes in shares.items() for n, c in nodes.items()), default=0.0)
    fixed_s = max((c * times[s][n] for s, nodes in fixed.items() for n, c in nodes.items()), default=0.0)
    return RoutingPlan(shares, bound, plan_s, fixed_s)
