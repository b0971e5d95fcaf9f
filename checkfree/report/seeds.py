"""Multi-seed comparisons: runs that differ only in seed, aggregated into intervals, paired differences and
verdicts that say in how many seeds an ordering holds.

A *seed set* is the set of comparison groups (:class:`~checkfree.report.analysis.Group`, one per failure seed)
that share config, per-iteration failure probability, world size and schedule. ``benchmarks/paper_comparison.sh``
with ``SEEDS="0 1 2"`` produces one per rate (failure seed and model seed move together by default).

Paired differences subtract, seed by seed, the reference run of the same seed (``no_failure`` without swaps, or
``checkfree``): the failures are identical within a seed, so pairing removes the between-seed spread.
``no_failure`` does not depend on the failure rate, so a no-failure run of the same config, seed and world size
serves every rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from checkfree.report.analysis import Group, Row, Verdict
from checkfree.report.stats import Interval, mean_ci, sign_test_p


@dataclass
class SeedSet:
    """Groups (one per seed) that differ only in seed; ``scope`` is their shared key without the seed."""

    scope: tuple[Any, ...]
    groups: list[Group] = field(default_factory=list)

    @property
    def seeds(self) -> list[Any]:
        return [g.seed for g in self.groups]

    @property
    def title(self) -> str:
        return self.groups[0].scope_title

    def labels(self) -> list[str]:
        seen: dict[str, None] = {}
        for g in self.groups:
            for r in g.rows:
                seen.setdefault(r.run.label, None)
        return list(seen)

    def rows(self, label: str) -> dict[Any, Row]:
        """The finished run of strategy ``label`` for each seed that has one. A partial run (not ended: still
        running, killed, stopped by a signal or crashed) is left out: it has neither a time to the target nor a loss
        at its cap, and counting it as censored would judge a run that has not ended (:meth:`incomplete` names
        them)."""
        return {
            g.seed: row
            for g in self.groups
            if (row := g.by_strategy(label)) is not None and not row.run.partial
        }

    def incomplete(self, label: str) -> dict[Any, Row]:
        """The partial runs (not ended) of strategy ``label``, by seed: left out of every comparison."""
        return {
            g.seed: row for g in self.groups if (row := g.by_strategy(label)) is not None and row.run.partial
        }


def seed_sets(groups: list[Group]) -> list[SeedSet]:
    """Comparison groups gathered by their seedless scope, in the order they come."""
    sets: dict[tuple[Any, ...], SeedSet] = {}
    for g in groups:
        sets.setdefault(g.scope, SeedSet(g.scope)).groups.append(g)
    return list(sets.values())


def _loss(row: Row) -> float:
    return row.run.final_eval["val_loss"]


def _interval(values: list[float]) -> Interval | None:
    finite = [v for v in values if math.isfinite(v)]
    return mean_ci(finite) if finite and len(finite) == len(values) else None


@dataclass
class StrategySeeds:
    """One strategy of a seed set, over its seeds."""

    label: str
    seeds: list[Any]
    loss: Interval | None
    """Final validation loss (nats); None when a seed's loss is not finite."""
    hours: Interval | None
    """Simulated hours to target; None unless every seed reached the target."""
    reached: int
    minus_no_failure: Interval | None = None
    """Paired difference of final validation loss, this − no_failure, over the seeds both have."""
    minus_checkfree: Interval | None = None
    """Paired difference of final validation loss, this − checkfree, over the seeds both have."""
    nonfinite: list[Any] = field(default_factory=list)
    """The seeds whose final validation loss is not finite (a diverged run): they void :attr:`loss`."""


def _paired(mine: dict[Any, Row], ref: dict[Any, Row]) -> Interval | None:
    seeds = [s for s in mine if s in ref]
    return _interval([_loss(mine[s]) - _loss(ref[s]) for s in seeds]) if seeds else None


def strategy_seeds(seed_set: SeedSet, no_failure: dict[Any, Row]) -> list[StrategySeeds]:
    """Per strategy of ``seed_set``: intervals of final loss and hours to target, and the paired differences.

    ``no_failure`` maps seed → the reference run (see :func:`no_failure_rows`).
    """
    checkfree = seed_set.rows("checkfree")
    out = []
    for label in seed_set.labels():
        rows = seed_set.rows(label)
        hours = [r.hours_to_target for r in rows.values()]
        reached = [h for h in hours if h is not None]
        out.append(
            StrategySeeds(
                label,
                list(rows),
                _interval([_loss(r) for r in rows.values()]),
                mean_ci(reached) if reached and len(reached) == len(hours) else None,
                len(reached),
                None if label == "no_failure" else _paired(rows, no_failure),
                None if label == "checkfree" else _paired(rows, checkfree),
                [seed for seed, r in rows.items() if not math.isfinite(_loss(r))],
            )
        )
    return out


def no_failure_rows(seed_set: SeedSet, all_groups: list[Group]) -> dict[Any, Row]:
    """seed → the no-failure run (no swaps preferred) of the same config and world size, from any rate."""
    config, world = seed_set.scope[0], seed_set.scope[2]
    out: dict[Any, Row] = {}
    for g in all_groups:
        if g.config != config or g.key[3] != world:
            continue
        for r in g.rows:
            if r.run.strategy == "no_failure" and (g.seed not in out or out[g.seed].run.swaps > r.run.swaps):
                out[g.seed] = r
    return out


@dataclass
class SeedVerdict:
    """An ordering judged in each seed: it holds in ``holds`` of ``judged`` seeds."""

    statement: str
    where: str
    holds: int
    seeds: list[Any]
    """The seeds judged."""
    missing: list[Any] = field(default_factory=list)
    """Seeds with a comparison group but not judged (runs missing)."""

    @property
    def judged(self) -> int:
        return len(self.seeds)

    @property
    def p_value(self) -> float | None:
        """One-sided sign test (:func:`~checkfree.report.stats.sign_test_p`); None when no seed was judged."""
        return sign_test_p(self.holds, self.judged) if self.judged else None

    def line(self) -> str:
        if not self.judged:
            return f"- {self.statement} ({self.where}): **not judged** (runs missing in every seed)."
        if self.judged == 1:
            verdict = "holds" if self.holds else "does not hold"
            return (
                f"- {self.statement} ({self.where}): **{verdict}** in the single seed judged (single-seed)."
            )
        missing = (
            f"; not judged, runs missing: seed {', '.join(map(str, self.missing))}" if self.missing else ""
        )
        return (
            f"- {self.statement} ({self.where}): **holds in {self.holds} of {self.judged} seeds** "
            f"(sign test p = {self.p_value:.3g}; seeds {', '.join(map(str, self.seeds))}{missing})."
        )


def seed_verdicts(verdicts: list[Verdict], titles: dict[tuple[Any, ...], str]) -> list[SeedVerdict]:
    """Gather per-seed verdicts of the same statement and scope; ``titles`` names each scope for the line."""
    gathered: dict[tuple[str, tuple[Any, ...]], list[Verdict]] = {}
    for v in verdicts:
        gathered.setdefault((v.statement, v.scope), []).append(v)
    out = []
    for (statement, scope), vs in gathered.items():
        judged = [v for v in vs if v.holds is not None]
        where = titles.get(scope, ", ".join(map(str, scope)))
        out.append(
            SeedVerdict(
                statement,
                where,
                sum(bool(v.holds) for v in judged),
                [v.seed for v in judged],
                [v.seed for v in vs if v.holds is None],
            )
        )
    return out


def _cell(interval: Interval | None, spec: str = ".4f") -> str:
    return "—" if interval is None else interval.format(spec)


def section(groups: list[Group], verdicts: list[Verdict]) -> list[str]:
    """Markdown: one table per seed set with more than one seed, then the verdicts over seeds."""
    sets = seed_sets(groups)
    multi = [s for s in sets if len(s.groups) > 1]
    if not multi:
        return [
            "## Across seeds",
            "",
            "Every comparison group is single-seed: verdicts above are single-seed results. Run "
            '`benchmarks/paper_comparison.sh` with `SEEDS="0 1 2"` for intervals and sign tests.',
            "",
        ]
    lines = [
        "## Across seeds",
        "",
        "Mean ± half-width of the two-sided 95 % Student-t interval over seeds; paired differences subtract the "
        "reference run of the same seed (same failures). Hours to target only when every seed reached it.",
        "",
    ]
    header = [
        "strategy",
        "seeds",
        "final val loss",
        "− no_failure (paired)",
        "− checkfree (paired)",
        "reached target",
        "hours to target",
    ]
    for s in multi:
        ref = no_failure_rows(s, groups)
        body = [
            [
                st.label,
                str(len(st.seeds)),
                _cell(st.loss)
                + (f" (not finite in seeds {', '.join(map(str, st.nonfinite))})" if st.nonfinite else ""),
                _cell(st.minus_no_failure, "+.4f"),
                _cell(st.minus_checkfree, "+.4f"),
                f"{st.reached} of {len(st.seeds)}",
                _cell(st.hours, ".4g"),
            ]
            for st in strategy_seeds(s, ref)
        ]
        lines += [f"### {s.title}, seeds {', '.join(map(str, s.seeds))}", ""]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body] + [""]
    titles = {s.scope: s.title for s in sets}
    for v in verdicts:  # Fig. 4c's scope is (config, world size)
        if v.scope not in titles and len(v.scope) == 2:
            titles[v.scope] = f"{v.scope[0]}, world size {v.scope[1]}"
    lines += ["Orderings over seeds:", ""] + [v.line() for v in seed_verdicts(verdicts, titles)] + [""]
    return lines
