"""The pure cost of CheckFree+'s swaps (paper Fig. 4c): no failures act, swaps on versus off, paired by seed.

CheckFree+ runs the first two and the last two stages swapped on odd microbatches (paper §4.2) so that the end
stages can be copied from their partners; with no failure that costs some convergence (Fig. 4c). Per config and
seed, the no-failure run without swaps and the one with swaps (:func:`checkfree.report.analysis.swap_pairs`) are
compared two ways:

* **iterations to the seed's target**: the crossing (:func:`checkfree.report.timing.crossing_iteration`) of each
  run, and their ratio swaps ÷ no swaps (> 1: swaps train slower); a run that stopped before the target is
  censored, its ratio a lower bound;
* **validation loss at the last iteration both validated** (swaps − no swaps, nats; > 0: swaps are behind).

Over the seeds of a config: mean ± 95 % t interval of each, and the one-sided sign and Wilcoxon tests that swaps
are slower (checkfree.report.stats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from checkfree.report.analysis import Group, last_common_eval, swap_pairs
from checkfree.report.runs import Run
from checkfree.report.stats import Interval, mean_ci, sign_test_p, wilcoxon_p
from checkfree.report.timing import Crossing, crossing_iteration


@dataclass
class SeedSwapCost:
    """One seed's pair of no-failure runs."""

    seed: Any
    plain: Run
    swapped: Run
    plain_crossing: Crossing | None
    swapped_crossing: Crossing | None
    common: tuple[int, float, float] | None
    """(iteration, loss without swaps, loss with swaps) at the last common validation."""

    @property
    def ratio(self) -> float | None:
        """Iterations to target, swaps ÷ no swaps; None unless both reached it."""
        a, b = self.plain_crossing, self.swapped_crossing
        if a is None or b is None or not (a.reached and b.reached) or not a.iteration:
            return None
        return b.iteration / a.iteration

    @property
    def loss_difference(self) -> float | None:
        return None if self.common is None else self.common[2] - self.common[1]


@dataclass
class ConfigSwapCost:
    config: str
    world_size: int
    seeds: list[SeedSwapCost]

    def ratio_interval(self) -> Interval | None:
        values = [s.ratio for s in self.seeds if s.ratio is not None]
        return mean_ci(values) if values else None

    def loss_interval(self) -> Interval | None:
        values = [d for s in self.seeds if (d := s.loss_difference) is not None]
        return mean_ci(values) if values else None

    def tests(self) -> tuple[int, int, float | None, float | None]:
        """(seeds where swaps are behind, seeds compared, sign-test p, Wilcoxon p) on the loss difference."""
        diffs = [d for s in self.seeds if (d := s.loss_difference) is not None]
        if not diffs:
            return 0, 0, None, None
        behind = sum(d > 0 for d in diffs)
        return behind, len(diffs), sign_test_p(behind, len(diffs)), wilcoxon_p(diffs)


def swap_costs(groups: list[Group]) -> list[ConfigSwapCost]:
    """The paired no-failure runs of every config and world size among ``groups`` (their rows' runs), each run
    measured against its own group's target."""
    target_of = {id(row.run): g.target for g in groups for row in g.rows}
    runs = [row.run for g in groups for row in g.rows]
    by_config: dict[tuple[str, int], list[SeedSwapCost]] = {}
    for (config, seed, world), pair in sorted(swap_pairs(runs).items(), key=lambda kv: str(kv[0])):
        if len(pair) < 2:
            continue
        plain, swapped = pair[False], pair[True]
        target = target_of.get(id(plain))
        by_config.setdefault((config, world), []).append(
            SeedSwapCost(
                seed,
                plain,
                swapped,
                None if target is None else crossing_iteration(plain.evals, target),
                None if target is None else crossing_iteration(swapped.evals, target),
                last_common_eval(plain, swapped),
            )
        )
    return [ConfigSwapCost(c, w, seeds) for (c, w), seeds in by_config.items()]


def _crossing(c: Crossing | None, run: Run) -> str:
    if c is None:
        return "no target"
    if c.reached:
        return f"{c.iteration:.1f}"
    return f"censored at {run.iterations} (best {c.best_loss:.4f})"


def _p(p: float | None) -> str:
    return "—" if p is None else f"{p:.3g}"


def section(groups: list[Group]) -> list[str]:
    """Markdown: per config, each seed's pair and the aggregate (nothing when no config has a pair)."""
    costs = swap_costs(groups)
    if not costs:
        return []
    lines = [
        "## The pure cost of swapping (paper Fig. 4c)",
        "",
        "No failure acts; the no-failure run with CheckFree+'s swaps against the one without, seed by seed. "
        "Iterations to the seed's target (ratio > 1: swaps are slower) and the validation loss at the last "
        "iteration both runs validated (difference > 0: swaps are behind). Mean ± 95 % t interval over seeds; "
        "one-sided sign and Wilcoxon signed-rank tests that swaps are behind.",
        "",
    ]
    for c in costs:
        body = []
        for s in c.seeds:
            it = "—" if s.common is None else f"{s.common[0]}"
            body.append(
                [
                    str(s.seed),
                    _crossing(s.plain_crossing, s.plain),
                    _crossing(s.swapped_crossing, s.swapped),
                    "—" if s.ratio is None else f"{s.ratio:.3f}",
                    it,
                    "—" if s.loss_difference is None else f"{s.loss_difference:+.4f}",
                ]
            )
        ratio, loss = c.ratio_interval(), c.loss_interval()
        behind, n, sign_p, wil_p = c.tests()
        lines += [f"### {c.config}, world size {c.world_size}", ""]
        lines += _table(
            [
                "seed",
                "no swaps: iterations to target",
                "swaps: iterations to target",
                "ratio",
                "last common validation",
                "loss swaps − no swaps",
            ],
            body,
        )
        lines += [
            "",
            f"Iterations to target, swaps ÷ no swaps: {'—' if ratio is None else ratio.format('.3f')}; "
            f"loss difference: {'—' if loss is None else loss.format('+.4f')} nats; swaps behind in {behind} of "
            f"{n} seeds (sign test p = {_p(sign_p)}, Wilcoxon p = {_p(wil_p)}).",
            "",
        ]
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]
