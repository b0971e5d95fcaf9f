"""From loaded runs to numbers: comparison groups, the timing model per config, time to target, verdicts.

A *comparison group* holds the runs that saw the same failures: same config, per-iteration failure probability,
failure seed and world size (docs/paper.md §1: the injector draws identical failures for every strategy of a seed).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from checkfree.report.runs import Run, SwarmRun
from checkfree.report.timing import (
    Crossing,
    RunTimeline,
    TimingModel,
    crossing_iteration,
    hourly_rate,
    implied_iteration_seconds,
    stage_parameter_count,
)

AUTO_TARGET_FRACTION = 0.75
"""``--target-loss auto``: the no-failure run's validation loss at this fraction of its iterations."""


@dataclass
class TimingOptions:
    """The report's command-line choices for the timing model (None = resolve from the runs)."""

    iteration_seconds: float | None = None
    forward_seconds: float | None = None
    recovery_seconds: float | None = None
    redundant_ratio: str = "measured"
    """"measured" or "paper" (checkfree.report.timing.TimingModel.redundant_source)."""


@dataclass
class Row:
    """One run's line of the report table, with everything computed."""

    run: Run
    timeline: RunTimeline
    crossing: Crossing
    hours_to_target: float | None
    hours_total: float
    speedup_vs_checkpoint: float | None = None
    speedup_note: str = ""


@dataclass
class Group:
    key: tuple[Any, ...]
    rows: list[Row] = field(default_factory=list)
    target: float | None = None
    """The validation loss (nats) this group's runs aim at (:class:`Targets`); None: no target for its seed."""

    @property
    def config(self) -> str:
        return str(self.key[0])

    @property
    def rate(self) -> float:
        rates = {r.run.rate for r in self.rows if math.isfinite(r.run.rate)}
        return rates.pop() if len(rates) == 1 else math.nan

    @property
    def p_iter(self) -> float:
        return float(self.key[1]) if isinstance(self.key[1], float) else math.nan

    @property
    def title(self) -> str:
        rate = f"{self.rate:g} %/h" if math.isfinite(self.rate) else "mixed rates"
        return (
            f"{self.config}, {rate} (p_iter {self.p_iter:g}), failure seed {self.key[2]}, "
            f"world size {self.key[3]}"
        )

    @property
    def seed(self) -> Any:
        return self.key[2]

    @property
    def scope(self) -> tuple[Any, ...]:
        """The group key without the failure seed: groups that differ only in seed share it."""
        return (self.key[0], self.key[1], *self.key[3:])

    @property
    def scope_title(self) -> str:
        rate = f"{self.rate:g} %/h" if math.isfinite(self.rate) else "mixed rates"
        return f"{self.config}, {rate} (p_iter {self.p_iter:g}), world size {self.key[3]}"

    def by_strategy(self, label: str) -> Row | None:
        for r in self.rows:
            if r.run.label == label:
                return r
        return None

    def ended(self, label: str) -> Row | None:
        """:meth:`by_strategy`, but None for a partial run (not ended: still running, killed, stopped or crashed),
        which no verdict may judge: it has neither a time to the target nor a loss at its cap."""
        row = self.by_strategy(label)
        return None if row is None or row.run.partial else row


def group_key(run: Run) -> tuple[Any, ...]:
    p = run.p_iter
    return (
        run.config_name,
        round(p, 10) if math.isfinite(p) else "?",
        run.failure_seed,
        run.world_size,
        str(run.options.get("failure_schedule") or ""),
    )


def _formula_inputs(run: Run, forward_seconds: float | None) -> dict[str, Any] | None:
    c = run.config
    try:
        inputs = {
            "n_stages": int(c["n_stages"]),
            "batch_size": int(c["batch_size"]),
            "dmodel": int(c["dmodel"]),
            "seq_l": int(c["seq_l"]),
            "world_size": run.world_size,
            "stage_parameters": stage_parameter_count(
                str(c.get("architecture", "LLaMa")), int(c["dmodel"]), int(c["n_layers_per_stage"])
            ),
        }
    except (KeyError, TypeError, ValueError):
        return None
    if forward_seconds is not None:
        inputs["forward_seconds"] = forward_seconds
    return inputs


def swarm_measurements(swarms: list[SwarmRun]) -> tuple[float | None, float | None]:
    """Steady iteration seconds (mean over swarm runs, crash iterations left out since recoveries are added
    separately) and mean crash → serving latency over every recovery; None when absent."""
    steady = [m for s in swarms if (m := s.steady_iteration_seconds) is not None]
    lat = [x for s in swarms for x in s.recovery_latencies]
    return (sum(steady) / len(steady) if steady else None), (sum(lat) / len(lat) if lat else None)


def timing_models(runs: list[Run], swarms: list[SwarmRun], opts: TimingOptions) -> dict[str, TimingModel]:
    """One timing model per config: every strategy of a config is timed with the same T_iter.

    The measured compute seconds are the median over the config's non-redundant runs of each run's median
    iteration seconds (the shared machine is noisy; the median resists it).
    """
    swarm_it, swarm_rec = swarm_measurements(swarms)
    models: dict[str, TimingModel] = {}
    for config in sorted({r.config_name for r in runs}):
        members = [r for r in runs if r.config_name == config]
        medians = [
            m for r in members if r.strategy != "redundant" and (m := r.costs().median_compute_seconds)
        ]
        if not medians:
            medians = [m for r in members if (m := r.costs().median_compute_seconds)]
        compute = statistics.median(medians) if medians else None
        inputs = next((i for r in members if (i := _formula_inputs(r, opts.forward_seconds))), None)
        models[config] = TimingModel.resolve(
            explicit_iteration_seconds=opts.iteration_seconds,
            swarm_iteration_seconds=swarm_it,
            formula_inputs=inputs,
            compute_seconds=compute,
            explicit_recovery_seconds=opts.recovery_seconds,
            swarm_recovery_seconds=swarm_rec,
            redundant=opts.redundant_ratio,
        )
    return models


@dataclass(frozen=True)
class Targets:
    """The validation loss (nats) each comparison group aims at: one number for every group, or one per
    (config, failure seed, world size) for ``--target-loss nofail@N``."""

    default: float | None
    source: str
    per_seed: dict[tuple[str, Any, int], float] = field(default_factory=dict)

    def of(self, config: str, seed: Any, world_size: int) -> float | None:
        """The target of the groups of ``config``, ``seed`` and ``world_size``; None when there is none."""
        return self.per_seed.get((config, seed, world_size), self.default)

    @property
    def headline(self) -> float:
        """The one target, or the first per-seed target (for a single number in a title)."""
        return self.default if self.default is not None else next(iter(self.per_seed.values()))

    def describe(self) -> str:
        """Markdown: the target(s) and where they come from."""
        if not self.per_seed:
            return f"Target validation loss **{self.headline:.4f}** ({self.source})."
        each = "; ".join(
            f"{config} seed {seed} (W {world}): **{loss:.4f}**"
            for (config, seed, world), loss in sorted(self.per_seed.items(), key=lambda kv: str(kv[0]))
        )
        return f"Target validation loss per seed ({self.source}): {each}."

    def to_json(self) -> Any:
        if not self.per_seed:
            return self.default
        return {f"{c} seed {s} W {w}": loss for (c, s, w), loss in self.per_seed.items()}


NOFAIL_PREFIX = "nofail@"
"""``--target-loss nofail@N``: per seed, the no-failure (no swaps) run's validation loss at effective iteration N."""


def resolve_targets(runs: list[Run], spec: float | str) -> Targets:
    """The :class:`Targets` of ``--target-loss``: a number, "auto" (:func:`auto_target`) or "nofail@N".

    "nofail@N": for every (config, failure seed, world size) with a no-failure run without swaps, that run's
    validation loss at effective iteration N (the paper's target is where its no-failure run crosses a loss:
    here the loss is taken where the no-failure run stands at N, seed by seed; each seed's failure runs aim at
    their own seed's loss).

    Raises:
        ValueError: a malformed spec, "auto" without a no-failure run, or "nofail@N" where no no-failure run has a
            validation at effective iteration N.
    """
    if not isinstance(spec, str):
        return Targets(float(spec), "given")
    if spec == "auto":
        loss, source = auto_target(runs)
        return Targets(loss, source)
    if not spec.startswith(NOFAIL_PREFIX) or not spec[len(NOFAIL_PREFIX) :].isdigit():
        raise ValueError(f"--target-loss {spec!r} is invalid; expected a number, 'auto' or 'nofail@N'.")
    n = int(spec[len(NOFAIL_PREFIX) :])
    per_seed: dict[tuple[str, Any, int], float] = {}
    for r in sorted(runs, key=lambda r: r.name):
        if r.strategy != "no_failure" or r.swaps:
            continue
        at = [loss for e, loss in r.evals_by_effective if e == n]
        key = (r.config_name, r.failure_seed, r.world_size)
        if at and key not in per_seed:
            per_seed[key] = at[-1]
    if not per_seed:
        raise ValueError(
            f"--target-loss {spec}: no no-failure run without swaps has a validation at effective iteration "
            f"{n}; expected such a run per seed among the run directories."
        )
    return Targets(
        None, f"the no-failure run without swaps of each seed at effective iteration {n}", per_seed
    )


def auto_target(runs: list[Run], fraction: float = AUTO_TARGET_FRACTION) -> tuple[float, str]:
    """Target loss for ``--target-loss auto``: the first no-failure run (no swaps preferred) at ``fraction``.

    Raises:
        ValueError: no no_failure run was given.
    """
    refs = sorted((r for r in runs if r.strategy == "no_failure"), key=lambda r: (r.swaps, r.name))
    if not refs:
        raise ValueError(
            "--target-loss auto needs a no_failure run among the run directories; give a number."
        )
    ref = refs[0]
    evals = sorted(ref.evals)
    goal = fraction * max(it for it, _ in evals)
    it, loss = next((it, loss) for it, loss in evals if it >= goal)
    return loss, (
        f"auto: validation loss of the no-failure run {ref.name} at iteration {it} "
        f"({fraction:.0%} of its {max(i for i, _ in evals)} iterations)"
    )


def analyse(runs: list[Run], models: dict[str, TimingModel], target: float | Targets) -> list[Group]:
    """Rows with time to target, grouped by identical failures, with speed-ups versus ``checkpoint``.

    ``target``: one validation loss (nats) for every group, or :class:`Targets`; a group without a target has
    no crossing (its rows never reach it)."""
    targets = target if isinstance(target, Targets) else Targets(float(target), "given")
    groups: dict[tuple[Any, ...], Group] = {}
    for run in runs:
        key = group_key(run)
        goal = targets.of(run.config_name, run.failure_seed, run.world_size)
        tl = models[run.config_name].timeline(run.costs())
        cross = crossing_iteration(run.evals, goal) if goal is not None else Crossing(None)
        hours = tl.hours_at(cross.iteration) if cross.reached else None
        row = Row(run, tl, cross, hours, tl.hours_at(run.iterations))
        groups.setdefault(key, Group(key, target=goal)).rows.append(row)
    out = []
    for g in sorted(
        groups.values(), key=lambda g: (g.config, g.rate if math.isfinite(g.rate) else 1e9, str(g.key))
    ):
        g.rows.sort(key=lambda r: (STRATEGY_ORDER.get(r.run.strategy, 99), r.run.swaps, r.run.name))
        ref = g.by_strategy("checkpoint")
        for row in g.rows:
            if ref is None:
                row.speedup_note = "no checkpoint run on these failures"
            elif ref.hours_to_target is None:
                row.speedup_note = "checkpoint never reached the target"
            elif row.hours_to_target is None:
                row.speedup_note = "never reached the target"
            else:
                row.speedup_vs_checkpoint = (
                    ref.hours_to_target / row.hours_to_target if row.hours_to_target else None
                )
        out.append(g)
    return out


STRATEGY_ORDER = {
    name: i
    for i, name in enumerate(
        [
            "no_failure",
            "random",
            "copy",
            "zero",
            "average",
            "checkfree",
            "checkfree_plus",
            "checkpoint",
            "one",
            "redundant",
            "ec_snapshot",
            "ladder",
        ]
    )
}


def rate_context(group: Group, model: TimingModel) -> str:
    """The nominal %/h next to what p_iter means at the modelled iteration time (docs/paper.md §1 conversion)."""
    p = group.p_iter
    if not (isinstance(p, float) and 0 < p < 1):
        return ""
    implied = hourly_rate(p, model.iteration_seconds)
    text = f"p_iter {p:g} per stage per iteration is {implied:.4g} %/h at the modelled {model.iteration_seconds:.4g} s"
    if math.isfinite(group.rate) and 0 < group.rate < 100:
        text += (
            f"; the nominal {group.rate:g} %/h corresponds to "
            f"{implied_iteration_seconds(group.rate, p):.4g} s per iteration"
        )
    return text


# ---------------------------------------------------------------------------------------------- verdicts
@dataclass
class Verdict:
    claim: str
    holds: bool | None
    """None: the runs needed to judge were not given."""
    evidence: str
    statement: str = ""
    """The ordering without its run context, e.g. "Fig. 2: final validation loss random ≫ copy > …"."""
    scope: tuple[Any, ...] = ()
    """The run context without the seed: verdicts of the same statement and scope are one claim over seeds."""
    seed: Any = None


def _fmt_loss(row: Row | None) -> str:
    return "missing" if row is None else f"{row.run.final_eval['val_loss']:.4f}"


def _fmt_hours(row: Row | None) -> str:
    if row is None:
        return "missing"
    return "never reached" if row.hours_to_target is None else f"{row.hours_to_target:.4g} h"


def _hours(row: Row) -> float:
    return math.inf if row.hours_to_target is None else row.hours_to_target


def _group_verdict(g: Group, statement: str, holds: bool | None, evidence: str) -> Verdict:
    head, ordering = statement.split(": ", 1)
    return Verdict(f"{head} ({g.title}): {ordering}", holds, evidence, statement, g.scope, g.seed)


def fig2_verdict(groups: list[Group], rate: float = 16.0) -> list[Verdict]:
    """Paper Fig. 2 at ``rate``: final validation loss random ≫ copy > average > CheckFree."""
    out = []
    for g in (g for g in groups if g.rate == rate):
        rows = [g.by_strategy(s) for s in ("random", "copy", "average")]
        rows.append(g.by_strategy("checkfree") or g.by_strategy("checkfree_plus"))
        names = ["random", "copy", "average", rows[3].run.strategy if rows[3] else "checkfree"]
        evidence = ", ".join(f"{n} {_fmt_loss(r)}" for n, r in zip(names, rows, strict=True))
        statement = f"Fig. 2: final validation loss random ≫ copy > average > {names[3]}"
        if any(r is None for r in rows):
            out.append(_group_verdict(g, statement, None, f"runs missing: {evidence}"))
            continue
        losses = [r.run.final_eval["val_loss"] for r in rows]
        holds = all(a > b for a, b in zip(losses, losses[1:], strict=False))
        gaps = (
            f"; gap random−copy {losses[0] - losses[1]:.4f} vs copy−{names[3]} {losses[1] - losses[3]:.4f} "
            "(≫ read as: the first gap is the larger)"
        )
        much = losses[0] - losses[1] > losses[1] - losses[3]
        out.append(_group_verdict(g, statement, holds and much, evidence + gaps))
    return out


TABLE2_NAMES = {
    "checkfree_plus": "CheckFree+",
    "checkfree": "CheckFree",
    "checkpoint": "checkpointing",
    "redundant": "redundant computation",
}
"""How Table 2 (docs/paper.md §7) names the strategies the report compares."""

TABLE2_PAIRS: dict[float, tuple[tuple[str, str], ...]] = {
    5.0: (
        ("checkfree_plus", "checkpoint"),
        ("checkfree_plus", "redundant"),
        ("checkfree", "checkpoint"),
        ("checkfree_plus", "checkfree"),
    ),
    10.0: (
        ("checkfree_plus", "checkpoint"),
        ("checkfree_plus", "redundant"),
        ("checkfree", "checkpoint"),
        ("checkfree_plus", "checkfree"),
    ),
    16.0: (
        ("redundant", "checkfree_plus"),
        ("redundant", "checkpoint"),
        ("checkfree_plus", "checkpoint"),
        ("checkfree", "checkpoint"),
        ("checkfree_plus", "checkfree"),
    ),
}
"""Per failure rate (%/h), the pairwise orderings (faster, slower) of hours to target that paper Table 2 shows
(docs/paper.md §7: e.g. at 5 %/h CheckFree+ 355.13 h < redundant 419.56 h < checkpointing 558.23 h; at 16 %/h
redundant 419.56 h < CheckFree+ 460.6 h < CheckFree 562.96 h < checkpointing 634.35 h)."""


def table2_statement(faster: str, slower: str) -> str:
    """The verdict statement of one pairwise Table 2 ordering, e.g. "Table 2: hours to target CheckFree+ <
    checkpointing" (``faster``, ``slower``: strategy names, keys of :data:`TABLE2_NAMES`; KeyError otherwise)."""
    return f"Table 2: hours to target {TABLE2_NAMES[faster]} < {TABLE2_NAMES[slower]}"


def _pair_verdict(g: Group, faster: str, slower: str) -> Verdict:
    """One pairwise ordering in one group: a run that never reached the target counts as infinitely slow; two
    that never reached it cannot be ordered (not judged)."""
    a, b = g.ended(faster), g.ended(slower)
    statement = table2_statement(faster, slower)
    evidence = f"{faster} {_fmt_hours(a)}, {slower} {_fmt_hours(b)}"
    if a is None or b is None:
        return _group_verdict(g, statement, None, f"runs missing: {evidence}")
    ha, hb = _hours(a), _hours(b)
    if not (math.isfinite(ha) or math.isfinite(hb)):
        return _group_verdict(g, statement, None, f"neither reached the target: {evidence}")
    if math.isfinite(ha) and math.isfinite(hb) and ha > 0:
        evidence += f" ({slower} ÷ {faster} = {hb / ha:.3g})"
    return _group_verdict(g, statement, ha < hb, evidence)


def table2_verdicts(groups: list[Group]) -> list[Verdict]:
    """Paper Table 2 (docs/paper.md §7), per group at 5, 10 and 16 %/h: the combined orderings (CheckFree+ <
    CheckFree < checkpointing at 5–10 %/h; redundant computation shortest at 16 %/h) and, after them, each
    pairwise ordering of :data:`TABLE2_PAIRS` as its own verdict (over seeds: :func:`seeds.seed_verdicts`)."""
    out = []
    for g in groups:
        rows = {s: g.ended(s) for s in ("checkfree_plus", "checkfree", "checkpoint", "redundant")}
        evidence = ", ".join(f"{s} {_fmt_hours(r)}" for s, r in rows.items())
        if g.rate in (5.0, 10.0):
            statement = "Table 2: hours to target CheckFree+ < CheckFree < checkpointing"
            need = [rows["checkfree_plus"], rows["checkfree"], rows["checkpoint"]]
            if any(r is None for r in need):
                out.append(_group_verdict(g, statement, None, f"runs missing: {evidence}"))
            else:
                h = [_hours(r) for r in need]
                holds = h[0] < h[1] < h[2] if any(map(math.isfinite, h)) else None
                out.append(_group_verdict(g, statement, holds, evidence))
        elif g.rate == 16.0:
            statement = "Table 2: redundant computation has the shortest time to target"
            if any(r is None for r in rows.values()):
                out.append(_group_verdict(g, statement, None, f"runs missing: {evidence}"))
            else:
                h = {s: _hours(r) for s, r in rows.items()}
                others = [v for s, v in h.items() if s != "redundant"]
                holds = (
                    None
                    if not math.isfinite(h["redundant"]) and not any(map(math.isfinite, others))
                    else all(h["redundant"] < v for v in others)
                )
                out.append(_group_verdict(g, statement, holds, evidence))
        out += [_pair_verdict(g, a, b) for a, b in TABLE2_PAIRS.get(g.rate, ())]
    return out


def swap_pairs(runs: list[Run]) -> dict[tuple[Any, ...], dict[bool, Run]]:
    """(config, seed, world size) → {swaps: the no-failure run}: the pairs of paper Fig. 4c, the first run by name
    of each kind."""
    pairs: dict[tuple[Any, ...], dict[bool, Run]] = {}
    for r in sorted((r for r in runs if r.strategy == "no_failure"), key=lambda r: r.name):
        pairs.setdefault((r.config_name, r.config.get("seed"), r.world_size), {}).setdefault(r.swaps, r)
    return pairs


def last_common_eval(a: Run, b: Run) -> tuple[int, float, float] | None:
    """The last wall-clock iteration both runs validated at, with each one's loss there; None when none is shared
    (two runs that stopped at different iterations are compared where both stand)."""
    la, lb = dict(a.evals), dict(b.evals)
    common = sorted(set(la) & set(lb))
    return (common[-1], la[common[-1]], lb[common[-1]]) if common else None


def fig4c_verdict(runs: list[Run]) -> list[Verdict]:
    """Paper Fig. 4c: with no failures, swapping (CheckFree+ execution) slows convergence slightly; judged on the
    validation loss at the last iteration both no-failure runs of a seed (without and with swaps) evaluated."""
    out = []
    for key, pair in sorted(swap_pairs(runs).items(), key=lambda kv: str(kv[0])):
        statement = "Fig. 4c: with no failures, swaps give a slightly higher validation loss"
        claim = f"Fig. 4c ({key[0]}, seed {key[1]}): with no failures, swaps give a slightly higher validation loss"
        scope = (key[0], key[2])
        common = last_common_eval(pair[False], pair[True]) if len(pair) == 2 else None
        if common is None:
            evidence = "needs no_failure runs both with and without swaps, validated at a common iteration"
            out.append(Verdict(claim, None, evidence, statement, scope, key[1]))
            continue
        it, a, b = common
        evidence = (
            f"validation loss at iteration {it}: no swaps {a:.4f} ({pair[False].name}), swaps "
            f"{b:.4f} ({pair[True].name}); difference {b - a:+.4f}"
        )
        out.append(Verdict(claim, b > a, evidence, statement, scope, key[1]))
    return out
