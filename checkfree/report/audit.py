"""The audit of the paper's checkpointing row (Table 2, docs/paper.md §7): what the authors' own rule gives.

``python -m checkfree.report.audit`` runs a Monte Carlo of the authors' checkpoint rule (their
``checkpoint_simulation.py``; checkfree.recovery.checkpoint, ``checkpoint_rule`` "authors") at the paper's scale:
the 500M model's 6 stages, the per-stage failure probability per iteration its config states for each rate
(``configs/500M_config_6x4.json``: 0.0009, 0.002, 0.004 at 5, 10, 16 %/h), a checkpoint every K = 100 iterations,
and the no-failure run's N = 10,000 iterations to loss 2.85 (Table 2: 419.56 h / 151.04 s). For each rate it prints

* the rule's cost, wall-clock iterations per trained iteration: the closed form (checkfree.sim.progress) and the
  Monte Carlo's mean ± 95 % interval over ``--runs`` failure seeds (checkfree.report.replay on a flat curve);
* the cost the paper's row implies: its hours × 3,600 s / 91.35 s (the checkpointing iteration, §5) / N;
* the per-iteration probability of any stage failing that the implied cost would need under the same rule, and
  its ratio to the stated one;
* the simulator's own rule (``effective``) at the same p and K, for comparison.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from checkfree import jsonio
from checkfree.failures.injection import StageFailureInjector
from checkfree.report.replay import replay_checkpoint
from checkfree.report.stats import mean_ci
from checkfree.sim.progress import any_failure_probability, expected_wall_iterations

PAPER_STAGES = 6
PAPER_EVERY = 100
"""K of the 500M model (docs/paper.md §5)."""
PAPER_ITERATIONS = 10_000
"""The no-failure run's iterations to loss 2.85 (Table 2: redundant computation's 419.56 h at 151.04 s)."""
CHECKPOINT_ITERATION_SECONDS = 91.35
"""The paper's iteration time with asynchronous checkpointing (docs/paper.md §5)."""
PAPER_P = {5: 0.0009, 10: 0.002, 16: 0.004}
"""configs/500M_config_6x4.json: a stage's failure probability per iteration, by %/h."""
PAPER_CHECKPOINT_HOURS = {5: 558.23, 10: 621.67, 16: 634.35}
"""Table 2's checkpointing row (docs/paper.md §7)."""


@dataclass
class RateAudit:
    """One rate's numbers (costs are wall-clock iterations per trained iteration)."""

    rate: int
    p_stage: float
    q_any: float
    cost_formula: float
    cost_monte_carlo: float
    cost_monte_carlo_half_width: float
    runs: int
    cost_effective_rule: float
    paper_hours: float
    paper_cost: float
    q_needed: float
    q_needed_ratio: float


def _cost(q: float, rule: str = "authors") -> float:
    return expected_wall_iterations(q, PAPER_EVERY, PAPER_ITERATIONS, rule, PAPER_EVERY) / PAPER_ITERATIONS


def probability_for_cost(cost: float) -> float:
    """The per-iteration probability q of any stage failing at which the authors' rule costs ``cost`` (bisection
    on the closed form, which grows with q).

    Raises:
        ValueError: ``cost`` ≤ 1.
    """
    if not cost > 1.0:
        raise ValueError(f"cost {cost} must exceed 1 (no failure costs 1).")
    lo, hi = 0.0, 0.5
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _cost(mid) < cost else (lo, mid)
    return (lo + hi) / 2


def monte_carlo(p_stage: float, runs: int, first_seed: int = 0) -> list[float]:
    """Wall-clock iterations per trained iteration of ``runs`` replays of the authors' rule at the paper's scale
    (failure seeds ``first_seed`` …)."""
    flat = {0: 1.0, PAPER_ITERATIONS: 1.0}
    out = []
    for seed in range(first_seed, first_seed + runs):
        src = StageFailureInjector(PAPER_STAGES, p_stage, seed)
        rep = replay_checkpoint(
            flat,
            src,
            PAPER_EVERY,
            PAPER_ITERATIONS,
            None,
            100 * PAPER_ITERATIONS,
            PAPER_ITERATIONS,
            "authors",
        )
        out.append(rep.wall_iterations / PAPER_ITERATIONS)
    return out


def audit(runs: int = 20, first_seed: int = 0) -> list[RateAudit]:
    """Every rate's :class:`RateAudit` (module docstring)."""
    out = []
    for rate, p in PAPER_P.items():
        q = any_failure_probability(p, PAPER_STAGES)
        ci = mean_ci(monte_carlo(p, runs, first_seed))
        paper_cost = PAPER_CHECKPOINT_HOURS[rate] * 3600 / CHECKPOINT_ITERATION_SECONDS / PAPER_ITERATIONS
        needed = probability_for_cost(paper_cost)
        out.append(
            RateAudit(
                rate,
                p,
                q,
                _cost(q),
                ci.mean,
                ci.half_width if not ci.single else math.nan,
                runs,
                _cost(q, "effective"),
                PAPER_CHECKPOINT_HOURS[rate],
                paper_cost,
                needed,
                needed / q,
            )
        )
    return out


def to_markdown(rows: list[RateAudit]) -> str:
    """The audit as a markdown table."""
    lines = [
        "| %/h | p (stage) | q (any stage) | authors' rule: formula | Monte Carlo (runs) | simulator's rule | "
        "paper's row: hours | its cost | q it needs | × stated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.rate} | {r.p_stage:g} | {r.q_any:.4f} | {r.cost_formula:.2f} | "
            f"{r.cost_monte_carlo:.2f} ± {r.cost_monte_carlo_half_width:.2f} ({r.runs}) | "
            f"{r.cost_effective_rule:.2f} | {r.paper_hours:.2f} | {r.paper_cost:.2f} | {r.q_needed:.4f} | "
            f"{r.q_needed_ratio:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checkfree.report.audit",
        description="Monte Carlo of the authors' checkpoint rule at the paper's scale against Table 2's row.",
    )
    parser.add_argument("--runs", type=int, default=20, help="failure seeds per rate (default 20)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first failure seed (default 0)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error(f"--runs is {args.runs}; expected at least 2 (an interval needs two runs).")
    if args.first_seed < 0:
        parser.error(f"--first-seed is {args.first_seed}; expected a non-negative integer.")
    rows = audit(args.runs, args.first_seed)
    print(to_markdown(rows))
    if args.json is not None:
        args.json.write_text(jsonio.dumps({"rows": [asdict(r) for r in rows]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
