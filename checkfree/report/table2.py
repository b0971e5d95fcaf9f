"""Paper Table 2 at this scale: hours to target per rate and strategy, the paired ratios against CheckFree+, each
pairwise ordering over seeds, and how all of it moves when the recovery cost per stage is halved or doubled.

Table 2 (docs/paper.md §7; paper §5.3) gives, for the 500M model, the hours to validation loss 2.85 of
checkpointing, redundant computation, CheckFree and CheckFree+ at 5, 10 and 16 %/h. Its headline is a ratio of
hours, checkpointing ÷ CheckFree+ (1.57 at 5 %/h) and redundant ÷ CheckFree+ (1.18). Here the hours are the
report's simulated hours to the target (:mod:`checkfree.report.timing`) and each ratio is *paired*: computed seed
by seed on the same failures, then averaged over the seeds where both runs reached the target.

The recovery cost per stage is the least certain input of the timing model (the paper's ≈30 s comes from one
geo-distributed testbed, docs/paper.md §5). :func:`summarise` therefore recomputes the hours, the verdicts and the
ratios with the recovery seconds × :data:`RECOVERY_FACTORS` (T_iter unchanged), through the same
:func:`~checkfree.report.analysis.analyse` as the main tables; nothing is tuned, the numbers are only printed.

A *family* is the runs of one config, world size and failure schedule over every rate and seed. A rate's seeds are
the seeds with any run at that rate (a study may run 5 seeds at 5 %/h and 3 at 10 %/h); a strategy that lacks one
of them says "runs missing", and a rate with no run at all expects the family's seeds (the union over its rates).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from checkfree.report.analysis import (
    TABLE2_NAMES,
    TABLE2_PAIRS,
    Group,
    Row,
    Targets,
    Verdict,
    analyse,
    table2_statement,
    table2_verdicts,
)
from checkfree.report.runs import NOT_ENDED, Run
from checkfree.report.seeds import (
    SeedSet,
    SeedVerdict,
    StrategySeeds,
    no_failure_rows,
    seed_sets,
    seed_verdicts,
    strategy_seeds,
)
from checkfree.report.stats import Interval, mean_ci, wilcoxon_p
from checkfree.report.timing import TimingModel

PAPER_TABLE2_HOURS: dict[str, dict[float, float]] = {
    "checkpoint": {5.0: 558.23, 10.0: 621.67, 16.0: 634.35},
    "redundant": {5.0: 419.56, 10.0: 419.56, 16.0: 419.56},
    "checkfree": {5.0: 367.81, 10.0: 405.87, 16.0: 562.96},
    "checkfree_plus": {5.0: 355.13, 10.0: 367.81, 16.0: 460.6},
}
"""Paper Table 2 (docs/paper.md §7): hours to validation loss 2.85 of the 500M model, by strategy and %/h."""
TABLE2_RATES = (5.0, 10.0, 16.0)
"""The failure rates (%/h) of Table 2."""
TABLE2_RATIOS = (
    ("checkpoint", "checkfree_plus"),
    ("redundant", "checkfree_plus"),
    ("checkfree", "checkfree_plus"),
)
"""(numerator, denominator) of the ratios of hours to target: the paper's headline two (paper §5.3: "1.57× faster
than …") and what CheckFree+'s swaps gain over CheckFree (367.81 / 355.13 = 1.04 at 5 %/h in Table 2)."""
RECOVERY_FACTORS = (0.5, 1.0, 2.0)
"""Multipliers of the recovery seconds per stage in the sensitivity table (1.0: the report's own model)."""


def paper_ratio(numerator: str, denominator: str, rate: float) -> float:
    """Table 2's ratio of hours to loss 2.85, ``numerator ÷ denominator`` at ``rate`` %/h (docs/paper.md §7).

    E.g. ``paper_ratio("checkpoint", "checkfree_plus", 5.0)`` = 558.23 / 355.13 ≈ 1.572 (dimensionless).

    Raises:
        KeyError: a strategy or rate that Table 2 does not have.
    """
    return PAPER_TABLE2_HOURS[numerator][rate] / PAPER_TABLE2_HOURS[denominator][rate]


def _name(strategy: str) -> str:
    return TABLE2_NAMES.get(strategy, strategy)


def _seed_key(seed: Any) -> tuple[int, Any]:
    return (0, seed) if isinstance(seed, int | float) and not isinstance(seed, bool) else (1, str(seed))


def _seeds_text(seeds: list[Any]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


@dataclass
class PairedRatio:
    """``numerator ÷ denominator`` of simulated hours to target, seed by seed (same failures in both runs)."""

    numerator: str
    denominator: str
    per_seed: dict[Any, float | str]
    """seed → the ratio, or why there is none ("runs missing", "checkpoint never reached", …)."""

    @property
    def values(self) -> list[float]:
        return [v for v in self.per_seed.values() if isinstance(v, float)]

    @property
    def interval(self) -> Interval | None:
        """Mean of the per-seed ratios with its two-sided 95 % Student-t interval; None when no seed has one."""
        return mean_ci(self.values) if self.values else None

    @property
    def reached(self) -> int:
        """Seeds where both runs reached the target (the ratios averaged)."""
        return len(self.values)

    @property
    def title(self) -> str:
        return f"{_name(self.numerator)} ÷ {_name(self.denominator)}"


def paired_ratio(seed_set: SeedSet | None, numerator: str, denominator: str, seeds: list[Any]) -> PairedRatio:
    """``numerator ÷ denominator`` of simulated hours to target (dimensionless) in each of ``seeds``.

    A seed without both runs, or where either never reached the target, gets the reason instead of a ratio
    (paper Table 2 ratios, docs/paper.md §7, need both times). ``seed_set`` None: no run at this rate. Raises nothing.
    """
    num = seed_set.rows(numerator) if seed_set else {}
    den = seed_set.rows(denominator) if seed_set else {}
    per_seed: dict[Any, float | str] = {}
    for seed in seeds:
        a, b = num.get(seed), den.get(seed)
        lacking = [s for s, r in ((numerator, a), (denominator, b)) if r is None]
        if a is None or b is None:
            per_seed[seed] = f"{lacking[0]} run missing" if len(lacking) == 1 else "runs missing"
        elif a.hours_to_target is None or b.hours_to_target is None:
            never = [s for s, r in ((numerator, a), (denominator, b)) if r.hours_to_target is None]
            per_seed[seed] = f"{' and '.join(never)} never reached"
        elif b.hours_to_target <= 0:
            per_seed[seed] = f"{denominator} at 0 h"
        else:
            per_seed[seed] = a.hours_to_target / b.hours_to_target
    return PairedRatio(numerator, denominator, per_seed)


@dataclass
class RateNumbers:
    """One rate of a family under one timing model; ``seed_set`` None when no run has this rate."""

    rate: float
    seed_set: SeedSet | None
    seeds: list[Any] = field(default_factory=list)
    """The seeds this rate is expected to have: those of ``seed_set``, or the family's when it is None."""
    strategies: dict[str, StrategySeeds] = field(default_factory=dict)
    ratios: list[PairedRatio] = field(default_factory=list)
    verdicts: list[tuple[SeedVerdict, dict[Any, Verdict]]] = field(default_factory=list)
    """Each Table 2 ordering over seeds, with the per-seed verdicts it aggregates."""

    @property
    def label(self) -> str:
        if self.seed_set is None:
            return f"{self.rate:g} %/h"
        return f"{self.rate:g} %/h (p_iter {self.seed_set.groups[0].p_iter:g})"

    wilcoxon: dict[str, tuple[float | None, int]] = field(default_factory=dict)
    """Pairwise ordering statement → (one-sided Wilcoxon signed-rank p of slower − faster hours over the seeds
    where both reached the target, that number of seeds)."""

    def hours(self, strategy: str, seed: Any) -> float | None | str:
        """Hours to target of ``strategy`` in ``seed``: a number, None (never reached) or "missing"."""
        row = self.row(strategy, seed)
        return "missing" if row is None else row.hours_to_target

    def row(self, strategy: str, seed: Any) -> Row | None:
        """The run of ``strategy`` in ``seed`` (None: no run)."""
        return self.seed_set.rows(strategy).get(seed) if self.seed_set else None


@dataclass
class FamilyNumbers:
    """Table 2's numbers for one config, world size and schedule, under one recovery factor."""

    title: str
    seeds: list[Any]
    """Every seed of the family, at any rate (each rate's own are :attr:`RateNumbers.seeds`)."""
    factor: float
    model: TimingModel
    rates: list[RateNumbers]


@dataclass
class Table2:
    """The Table 2 numbers per family, one entry per factor of :data:`RECOVERY_FACTORS` (×1 = the report)."""

    by_factor: dict[float, list[FamilyNumbers]]

    @property
    def families(self) -> list[FamilyNumbers]:
        """The report's own numbers (factor 1)."""
        return self.by_factor.get(1.0, [])


def _family(scope: tuple[Any, ...]) -> tuple[Any, ...]:
    return (scope[0], *scope[2:])


def family_numbers(
    groups: list[Group], models: dict[str, TimingModel], factor: float = 1.0
) -> list[FamilyNumbers]:
    """Table 2's numbers from ``groups`` (from :func:`~checkfree.report.analysis.analyse` with ``models``).

    Families with fewer than two Table 2 strategies at Table 2 rates are left out. ``factor`` is only recorded.
    """
    sets = seed_sets(groups)
    verdicts = table2_verdicts(groups)
    out = []
    for fam in dict.fromkeys(_family(s.scope) for s in sets):
        members = [s for s in sets if _family(s.scope) == fam]
        at_rates = [s for s in members if s.groups[0].rate in TABLE2_RATES]
        if sum(any(s.rows(label) for s in at_rates) for label in PAPER_TABLE2_HOURS) < 2:
            continue  # nothing of Table 2 to compare (e.g. a Fig. 2 comparison of rebuild rules)
        seeds = sorted({seed for s in members for seed in s.seeds}, key=_seed_key)
        rates = []
        for rate in TABLE2_RATES:
            here = [s for s in at_rates if s.groups[0].rate == rate] or [None]
            rates += [_rate_numbers(rate, s, seeds, groups, verdicts) for s in here]
        first = members[0].groups[0]
        title = f"{first.config}, world size {first.key[3]}" + (f", schedule {fam[-1]}" if fam[-1] else "")
        out.append(FamilyNumbers(title, seeds, factor, models[first.config], rates))
    return out


def _rate_numbers(
    rate: float, seed_set: SeedSet | None, seeds: list[Any], groups: list[Group], verdicts: list[Verdict]
) -> RateNumbers:
    if seed_set is not None:
        seeds = sorted(set(seed_set.seeds), key=_seed_key)
    out = RateNumbers(rate, seed_set, seeds)
    out.ratios = [paired_ratio(seed_set, n, d, seeds) for n, d in TABLE2_RATIOS]
    if seed_set is None:
        return out
    stats = strategy_seeds(seed_set, no_failure_rows(seed_set, groups))
    out.strategies = {st.label: st for st in stats if st.label in PAPER_TABLE2_HOURS}
    mine = [v for v in verdicts if v.scope == seed_set.scope]
    for sv in seed_verdicts(mine, {}):
        out.verdicts.append((sv, {v.seed: v for v in mine if v.statement == sv.statement}))
    for faster, slower in TABLE2_PAIRS.get(rate, ()):
        fast, slow = seed_set.rows(faster), seed_set.rows(slower)
        diffs = [
            slow[seed].hours_to_target - fast[seed].hours_to_target
            for seed in fast
            if seed in slow
            and fast[seed].hours_to_target is not None
            and slow[seed].hours_to_target is not None
        ]
        out.wilcoxon[table2_statement(faster, slower)] = (wilcoxon_p(diffs) if diffs else None, len(diffs))
    return out


def summarise(
    groups: list[Group],
    runs: list[Run],
    models: dict[str, TimingModel],
    target: float | Targets,
    factors: tuple[float, ...] = RECOVERY_FACTORS,
) -> Table2:
    """Table 2's numbers under the report's timing model and with its recovery seconds per stage × each factor.

    ``groups`` are the report's own (factor 1); for any other factor the runs are analysed again by
    :func:`~checkfree.report.analysis.analyse` with :meth:`TimingModel.with_recovery_factor` models: same T_iter,
    same crossings, only the recovery seconds change. ``target`` is the validation loss (nats), or one per seed.

    Raises:
        ValueError: a factor that is not a finite number ≥ 0.
    """
    by_factor = {}
    for f in factors:
        scaled = {c: m.with_recovery_factor(f) for c, m in models.items()}
        gs = groups if f == 1 else analyse(runs, scaled, target)
        by_factor[f] = family_numbers(gs, scaled, f)
    return Table2(by_factor)


# ---------------------------------------------------------------------------------------------- markdown
def _f(value: float | None, spec: str = ".4g") -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def _interval(iv: Interval | None, spec: str = ".4g") -> str:
    return "—" if iv is None else iv.format(spec)


def _hours_cell(value: float | None | str) -> str:
    if value == "missing":
        return "missing"
    return "never" if value is None else f"{value:.4g}"


def _seed_cell(row: Row | None) -> str:
    """Hours to target, or why there are none: no run, or censored with the loss the run stopped at."""
    if row is None:
        return "missing"
    if row.hours_to_target is not None:
        return f"{row.hours_to_target:.4g}" + (" (replayed)" if row.run.summary.get("replayed") else "")
    fe = row.run.final_eval
    return f"censored ({fe['val_loss']:.4f} at it. {row.run.iterations})"


def _censored_seeds(seeds: list[Any]) -> str:
    return f"; censored: {', '.join(f's{x}' for x in seeds)}" if seeds else ""


def _hours_summary(st: StrategySeeds, rn: RateNumbers) -> str:
    """Mean ± 95 % CI when every seed reached the target; otherwise the median and range of those that did. Either
    way the seeds it rests on, and which were censored."""
    if st.hours is not None:
        return f"{_interval(st.hours)} ({_count(st.hours.n, 'seed')})"
    reached = sorted(h for s in st.seeds if isinstance(h := rn.hours(st.label, s), float))
    censored = _censored_seeds([s for s in st.seeds if rn.hours(st.label, s) is None])
    if not reached:
        return f"none of {len(st.seeds)} reached{censored}"
    mid = statistics.median(reached)
    spread = f", {reached[0]:.4g}–{reached[-1]:.4g}" if len(reached) > 1 else ""
    return f"median {mid:.4g} of the {len(reached)} that reached{spread}{censored}"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _ratio_cell(r: PairedRatio, n: int) -> str:
    iv = r.interval
    mean = "—" if iv is None else (f"{iv.mean:.3g}" if iv.single else iv.format(".3g"))
    censored = [seed for seed, v in r.per_seed.items() if isinstance(v, str) and "never reached" in v]
    return f"{mean} ({r.reached} of {n} seeds{_censored_seeds(censored)})"


def _by_reason(notes: dict[Any, str]) -> str:
    """ "s1, s2: runs missing; s0: …": seeds that share a reason, together."""
    reasons: dict[str, list[Any]] = {}
    for seed, why in notes.items():
        reasons.setdefault(why, []).append(seed)
    return "; ".join(f"{', '.join(f's{x}' for x in seeds)}: {why}" for why, seeds in reasons.items())


def _per_seed(r: PairedRatio) -> str:
    ratios = ", ".join(f"s{seed} {v:.3g}" for seed, v in r.per_seed.items() if isinstance(v, float))
    why = _by_reason({seed: v for seed, v in r.per_seed.items() if isinstance(v, str)})
    return "; ".join(x for x in (ratios, why) if x)


def _statement(statement: str) -> str:
    return statement.removeprefix("Table 2: ").removeprefix("hours to target ")


def _verdict_count(sv: SeedVerdict) -> str:
    if not sv.judged:
        return "not judged"
    return f"holds in {sv.holds} of {sv.judged} (p = {sv.p_value:.3g})"


def _not_judged(per_seed: dict[Any, Verdict], seeds: list[Any]) -> str:
    notes = {}
    for seed in seeds:
        v = per_seed.get(seed)
        if v is None:
            notes[seed] = "runs missing"
        elif v.holds is None:
            notes[seed] = v.evidence.split(":", 1)[0]
    return _by_reason(notes) or "—"


def _loss_cell(st: StrategySeeds) -> str:
    """Final validation loss over the strategy's seeds; a seed whose loss is not finite voids the interval and is
    named (its run diverged: a mean over the others would hide it)."""
    if st.loss is None:
        return "—" + (f" (not finite in {', '.join(f's{s}' for s in st.nonfinite)})" if st.nonfinite else "")
    return f"{_interval(st.loss, '.4f')} ({_count(st.loss.n, 'seed')})"


def _strategy_rows(fam: FamilyNumbers) -> list[list[str]]:
    rows = []
    for rn in fam.rates:
        n = len(rn.seeds)
        for strategy, paper in PAPER_TABLE2_HOURS.items():
            st = rn.strategies.get(strategy)
            paper_h = f"{paper[rn.rate]:g}"
            if st is None:
                rows.append(
                    [rn.label, _name(strategy), f"0 of {n} (runs missing)", "—", "—", "—", "—", paper_h]
                )
                continue
            missing = [s for s in rn.seeds if s not in st.seeds]
            runs = f"{len(st.seeds)} of {n}" + (f" (runs missing: {_seeds_text(missing)})" if missing else "")
            per_seed = ", ".join(f"s{seed} {_seed_cell(rn.row(strategy, seed))}" for seed in rn.seeds)
            rows.append(
                [
                    rn.label,
                    _name(strategy),
                    runs,
                    f"{st.reached} of {len(st.seeds)}",
                    _hours_summary(st, rn),
                    per_seed,
                    _loss_cell(st),
                    paper_h,
                ]
            )
    return rows


def section(table2: Table2, targets: Targets) -> list[str]:
    """Markdown: per family, hours to target by rate and strategy, the paired ratios beside the paper's, each
    Table 2 ordering over seeds (sign and Wilcoxon tests), the censored runs, and the sensitivity of orderings
    and ratios to the recovery cost."""
    families = table2.families
    if not families:
        return []
    goal = (
        f"the target {targets.headline:.4f}"
        if not targets.per_seed
        else "each seed's target (listed at the top of this report)"
    )
    lines = [
        "## Table 2 at this scale",
        "",
        "Paper Table 2 (docs/paper.md §7): hours of the 500M model to validation loss 2.85 at 5, 10 and 16 %/h. "
        f"Here: simulated hours to {goal} under the timing model above. Mean ± half-width of the two-sided 95 % "
        "Student-t interval over seeds when every seed reached it ('(1 seed)': no interval), else the median and "
        "range of the seeds that did; a run that stopped at its cap before the target is *censored*: it has no "
        "time, only its loss at the cap ('missing': no run; '(replayed)': computed from the no-failure run).",
        "",
    ]
    for fam in families:
        lines += [f"### {fam.title}, {_seeds_text(fam.seeds)}", ""]
        if any(rn.seeds != fam.seeds for rn in fam.rates):
            per_rate = "; ".join(
                f"{rn.rate:g} %/h {_seeds_text(rn.seeds)}" + ("" if rn.seed_set else " (no run)")
                for rn in fam.rates
            )
            lines += [
                f"Each rate is judged over its own seeds, those with a run at that rate: {per_rate}.",
                "",
            ]
        lines += _table(
            [
                "rate",
                "strategy",
                "runs",
                "reached target",
                "hours to target",
                "per seed (h)",
                "final val loss",
                "paper h",
            ],
            _strategy_rows(fam),
        )
        lines += [
            "",
            "Ratios of hours to target, paired seed by seed (same failures), mean over the seeds where both runs "
            "reached the target:",
            "",
        ]
        body = [
            [
                rn.label,
                r.title,
                _ratio_cell(r, len(rn.seeds)),
                _per_seed(r),
                f"{paper_ratio(r.numerator, r.denominator, rn.rate):.3g}",
            ]
            for rn in fam.rates
            for r in rn.ratios
        ]
        lines += _table(["rate", "ratio", "here: mean ± 95 % CI", "per seed", "paper"], body) + [""]
        lines += [
            "Table 2's orderings, each judged per seed: a censored run counts as slower than one that reached "
            "the target; two censored runs are not judged. One-sided sign test over the seeds judged; one-sided "
            "Wilcoxon signed-rank test on the paired differences of hours over the seeds where both reached:",
            "",
        ]
        body = []
        for rn in fam.rates:
            if rn.seed_set is None:
                body.append(
                    [rn.label, "every ordering", "not judged", "—", f"runs missing: {_seeds_text(rn.seeds)}"]
                )
                continue
            for sv, per_seed in rn.verdicts:
                body.append(
                    [
                        rn.label,
                        _statement(sv.statement),
                        _verdict_count(sv),
                        _wilcoxon_cell(rn.wilcoxon.get(sv.statement)),
                        _not_judged(per_seed, rn.seeds),
                    ]
                )
        lines += _table(["rate", "ordering (paper Table 2)", "here", "Wilcoxon", "not judged"], body) + [""]
        lines += _censored(fam)
        lines += _incomplete(fam)
        lines += _sensitivity(table2, fam)
    return lines


def _wilcoxon_cell(entry: tuple[float | None, int] | None) -> str:
    if entry is None:
        return "—"
    p, n = entry
    return f"n = {n}" if p is None else f"p = {p:.3g} (n = {n})"


def _incomplete(fam: FamilyNumbers) -> list[str]:
    """Markdown: the partial runs (not ended: see :attr:`Run.partial`) of the family's Table 2 strategies, left out
    of the table."""
    names = [
        f"`{row.run.name}`"
        for rn in fam.rates
        if rn.seed_set is not None
        for strategy in PAPER_TABLE2_HOURS
        for row in rn.seed_set.incomplete(strategy).values()
    ]
    if not names:
        return []
    return [
        f"Incomplete runs ({len(names)}), left out as missing (not ended: {NOT_ENDED}): "
        + ", ".join(names)
        + ".",
        "",
    ]


def _censored(fam: FamilyNumbers) -> list[str]:
    """Markdown: every run of the family's Table 2 strategies that did not reach its target."""
    body = []
    for rn in fam.rates:
        for strategy in PAPER_TABLE2_HOURS:
            for seed in rn.seeds:
                row = rn.row(strategy, seed)
                if row is None or row.hours_to_target is not None:
                    continue
                fe, run = row.run.final_eval, row.run
                body.append(
                    [
                        rn.label,
                        _name(strategy),
                        str(seed),
                        f"`{run.name}`",
                        str(run.iterations),
                        f"{fe['val_loss']:.4f}",
                    ]
                )
    if not body:
        return ["No run was censored: every run of Table 2's strategies reached its target.", ""]
    return (
        [f"Censored runs ({len(body)}): stopped at their cap before the target.", ""]
        + _table(
            ["rate", "strategy", "seed", "run", "wall-clock iterations", "validation loss at the cap"], body
        )
        + [""]
    )


def _same_rate(fam: FamilyNumbers, rn: RateNumbers) -> RateNumbers:
    """The entry of ``fam`` for the same rate and seed set as ``rn`` (another factor's numbers of the same runs)."""
    scope = rn.seed_set.scope if rn.seed_set else None
    return next(
        x for x in fam.rates if x.rate == rn.rate and (x.seed_set.scope if x.seed_set else None) == scope
    )


def _sensitivity(table2: Table2, fam: FamilyNumbers) -> list[str]:
    """The orderings and ratios of ``fam`` under every recovery factor, side by side."""
    columns: list[tuple[float, FamilyNumbers]] = []
    for f, families in sorted(table2.by_factor.items()):
        match = next((x for x in families if x.title == fam.title), None)
        if match is not None:
            columns.append((f, match))
    if len(columns) < 2:
        return []
    m = fam.model
    recov = ", ".join(f"×{f:g} = {x.model.recovery_seconds:.4g} s" for f, x in columns)
    lines = [
        f"#### Sensitivity to the recovery cost ({fam.title})",
        "",
        f"T_iter = {m.iteration_seconds:.4g} s per iteration in every column ({m.iteration_source}). Recovery per "
        f"recovered stage: {recov} (×1: {m.recovery_source}). Only the recovery seconds change: the iterations "
        "at which runs reach the target are the same in every column.",
        "",
    ]
    body = []
    for rn in fam.rates:
        if rn.seed_set is None:
            body.append([rn.label, "every ordering and ratio"] + ["runs missing"] * len(columns))
            continue
        same = [_same_rate(x, rn) for _, x in columns]
        for sv, _ in rn.verdicts:
            cells = []
            for other in same:
                match = next((o for o, _ in other.verdicts if o.statement == sv.statement), None)
                cells.append("—" if match is None else _verdict_count(match))
            body.append([rn.label, _statement(sv.statement)] + cells)
        for k, r in enumerate(rn.ratios):
            body.append([rn.label, r.title] + [_ratio_cell(other.ratios[k], len(rn.seeds)) for other in same])
    header = ["rate", "ordering / ratio"] + [f"×{f:g} ({x.model.recovery_seconds:.4g} s)" for f, x in columns]
    return lines + _table(header, body) + [""]
