"""report.md: the tables and verdicts as Markdown."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from checkfree.recovery.record import LATENCY_KEY
from checkfree.report import recoveries, seeds, swap_cost
from checkfree.report import table2 as table2_md
from checkfree.report import traces as traces_md
from checkfree.report.analysis import Group, Row, Targets, Verdict, rate_context
from checkfree.report.replay import Replays
from checkfree.report.runs import Run, SwarmRun
from checkfree.report.throughput_columns import SPEED_HEADERS, plan_text, speed_cells
from checkfree.report.timing import (
    PAPER_ITERATION_SECONDS,
    PAPER_RECOVERY_SECONDS,
    PAPER_REDUNDANT_ITERATION_SECONDS,
    IterationTimeFormula,
    TimingModel,
    crossing_iteration,
)


def _num(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _f(value: float, spec: str = ".4f") -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, spec)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _to_target(row: Row) -> tuple[str, str]:
    c = row.crossing
    if not c.reached:
        best = (
            f"best {_f(c.best_loss)} at it. {c.best_iteration}"
            if c.best_iteration is not None
            else "no finite loss"
        )
        return f"not reached ({best})", "not reached"
    its = f"{c.iteration:.1f}" + (" (interpolated)" if c.interpolated else "")
    return its, f"{row.hours_to_target:.4g}"


def results_table(group: Group) -> list[str]:
    body = []
    for row in group.rows:
        run = row.run
        its, hours = _to_target(row)
        speed = (
            f"{row.speedup_vs_checkpoint:.2f}×"
            if row.speedup_vs_checkpoint is not None
            else f"— ({row.speedup_note})"
        )
        rate = f"{run.rate:g} %/h (p {run.p_iter:g})" if math.isfinite(run.rate) else f"p {run.p_iter:g}"
        name = run.label + (" [partial]" if run.partial else "")
        fe = run.final_eval
        body.append(
            [
                f"{name} <br>`{run.name}`",
                rate,
                str(run.count("failures")),
                str(run.count("recoveries")),
                str(run.count("fallbacks")),
                _f(fe["val_loss"]),
                _f(fe["perplexity"], ".2f"),
                its,
                hours,
                speed,
            ]
        )
    return _table(
        [
            "setting",
            "failure rate",
            "failures",
            "recoveries",
            "fallbacks",
            "final val loss",
            "perplexity",
            "iterations to target",
            "simulated hours to target",
            "speed-up vs checkpoint",
        ],
        body,
    )


def cost_table(group: Group) -> list[str]:
    body = []
    for row in group.rows:
        costs = row.run.costs()
        x = row.crossing.iteration if row.crossing.reached else row.run.iterations
        b = row.timeline.breakdown(x)
        stall = b["save_stall"] + b["snapshot_stall"]
        ratio = (
            f"{row.timeline.ratio:.3f} ({row.timeline.ratio_source})" if row.timeline.ratio_source else "1"
        )
        mem = (row.run.summary.get("strategy_stats") or {}).get("extra_memory_bytes")
        traffic = costs.save_bytes + costs.snapshot_bytes + costs.parity_bytes
        body.append(
            [
                row.run.label,
                f"{row.timeline.iteration_seconds:.4g}",
                ratio,
                str(row.run.iterations),
                f"{costs.iterations_lost} ({costs.rollbacks} rollbacks)",
                f"{b['recovery'] / 3600:.3g}",
                f"{stall:.3g}",
                f"{b['total'] / 3600:.4g}",
                f"{row.hours_total:.4g}",
                f"{traffic / 2**20:.1f}" if traffic else "0",
                f"{mem / 2**20:.1f}" if isinstance(mem, int | float) else "—",
            ]
        )
    return _table(
        [
            "setting",
            "s / iteration",
            "iteration-time ratio",
            "wall iterations run",
            "iterations redone",
            "recovery h (to target or end)",
            "save + snapshot stalls s",
            "simulated h (to target or end)",
            "simulated h (whole run)",
            "checkpoint/snapshot MiB",
            "extra memory MiB",
        ],
        body,
    )


def timing_section(models: dict[str, TimingModel], swarms: list[SwarmRun] | None = None) -> list[str]:
    f = IterationTimeFormula()
    lines = [
        "## Timing model",
        "",
        "Simulated hours = wall-clock iterations × seconds per iteration + recovery seconds per recovered stage + "
        "checkpoint/snapshot save stalls (as recorded). Iterations a rollback redoes are wall-clock iterations, "
        "so checkpointing pays for them naturally. Redundant computation's iteration time is multiplied by its "
        "ratio (measured when the run recorded its redundant forward time, else the paper's "
        f"{PAPER_REDUNDANT_ITERATION_SECONDS} s / {PAPER_ITERATION_SECONDS} s; the cost table says which).",
        "",
    ]
    for config, m in models.items():
        lines += [
            f"- **{config}**: T_iter = {m.iteration_seconds:.4g} s — {m.iteration_source}.",
            f"  Recovery: {m.recovery_seconds:.4g} s per stage — {m.recovery_source}.",
        ]
    used = [
        f"{s.name} ({_f(s.steady_iteration_seconds, '.4g')} s)"
        for s in swarms or []
        if s.steady_iteration_seconds is not None
    ]
    if used and any("swarm" in m.iteration_source for m in models.values()):
        lines += [
            "",
            f"Swarm runs averaged for T_iter (steady iterations, crashes left out): {', '.join(used)}. "
            "When they trained another model than the simulator runs, give --iteration-seconds instead.",
        ]
    lines += [
        "",
        f"Formula constants (docs/paper.md §5, the authors' estimate): backward factor {f.backward_factor}, waves "
        f"{f.waves}, {f.bytes_per_element:g} bytes per element, activations {f.activation_bandwidth_gib_s} "
        f"GiB/s, data parallel {f.dp_bandwidth_gib_s} GiB/s. Paper: {PAPER_ITERATION_SECONDS} s per iteration "
        f"(500M), {PAPER_RECOVERY_SECONDS:g} s per stage recovery (geo-distributed testbed).",
        "",
    ]
    return lines


def verdict_lines(verdicts: list[Verdict]) -> list[str]:
    if not verdicts:
        return ["No ordering could be judged from these runs (the groups lack the strategies or rates).", ""]
    mark = {True: "**holds**", False: "**does not hold**", None: "**not judged**"}
    return [f"- {v.claim}: {mark[v.holds]}. {v.evidence}" for v in verdicts] + [""]


def swarm_section(swarms: list[SwarmRun]) -> list[str]:
    if not swarms:
        return []
    body = []
    for s in swarms:
        times, lat = s.iteration_times, s.recovery_latencies
        mean, steady = s.mean_iteration_seconds, s.steady_iteration_seconds
        total_bytes = sum(s.bytes_by_type.values())
        last = s.validation[-1] if s.validation else None
        body.append(
            [
                s.name,
                s.setting,
                str(s.rate if s.rate is not None else "—"),
                str(s.iterations or "—"),
                _f(mean, ".3f"),
                _f(steady, ".3f"),
                _f(statistics.median(times), ".3f") if times else "—",
                _f(s.tokens_per_second, ".1f") if s.tokens_per_second is not None else "—",
                str(len(s.recoveries)),
                _f(sum(lat) / len(lat), ".2f") if lat else "—",
                _f(max(lat), ".2f") if lat else "—",
                f"{total_bytes / 2**20:.1f}" if total_bytes else "—",
                _validation(last) if last is not None else "—",
                *speed_cells(s.data).split(" | "),
            ]
        )
    lines = ["## Swarm runs (throughput experiment)", ""]
    lines += _table(
        [
            "run",
            "setting",
            "rate",
            "iterations",
            "mean iteration s",
            "steady iteration s",
            "median iteration s",
            "tokens/s",
            "crashes/recoveries",
            "mean crash→serving s",
            "max crash→serving s",
            "MiB sent",
            "val loss (perplexity) @ iteration",
            *SPEED_HEADERS,
        ],
        body,
    )
    lines.append("")
    for s in swarms:
        detail = [
            f"node {r.get('node', '?')} (stage {r.get('stage', '?')}, iteration {r.get('iteration', '?')}) "
            f"→ {r.get('rule', '?')} from {'?' if r['source_nodes'] is None else r['source_nodes']}, "
            f"{_f(_num(r.get(LATENCY_KEY)), '.2f')} s, {r.get('bytes', '?')} B"
            for r in s.recoveries
        ]
        if detail:
            lines.append(f"- {s.name} recoveries: " + "; ".join(detail))
        if s.validation:
            lines.append(
                f"- {s.name} validation loss (perplexity) @ iteration: "
                + ", ".join(map(_validation, s.validation))
            )
        if plan_text(s.data):
            lines.append(f"- {s.name} routing plan (not applied to routes yet): {plan_text(s.data)}")
        if s.bytes_by_type:
            lines.append(
                f"- {s.name} bytes by message type: "
                + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sorted(s.bytes_by_type.items()))
            )
        if s.missing:
            lines.append(f"- {s.name}: throughput.json lacks {', '.join(s.missing)}")
    return lines + [""]


def _validation(row: dict) -> str:
    """One validation of a swarm run: "loss (perplexity) @ iteration"."""
    return f"{_f(row['val_loss'], '.4f')} ({_f(row['perplexity'], '.2f')}) @ {row['iteration']}"


def replay_section(replays: Replays, models: dict[str, TimingModel], targets: Targets) -> list[str]:
    """Markdown: which baselines were replayed, and each real run beside its replay (checkfree.report.replay)."""
    if not (replays.runs or replays.checks or replays.notes):
        return []
    lines = [
        "## Exact baselines by replay",
        "",
        "Checkpointing and redundant computation train the no-failure trajectory (a rollback redoes the same "
        "batches; a Bamboo restore is bit-exact), so their runs are computed from each seed's no-failure run, "
        "the same failure draws and the timing model (checkfree/report/replay.py), except where a real run "
        f"exists. {len(replays.runs)} run(s) replayed"
        + (f": {', '.join(f'`{r.name}`' for r in replays.runs)}" if replays.runs else "")
        + ".",
        "",
    ]
    if replays.checks:
        body = []
        for c in replays.checks:
            real, rep = c.real, c.replayed
            target = targets.of(real.config_name, real.failure_seed, real.world_size)
            cells = [f"`{real.name}`", real.strategy]
            for run in (real, rep):
                if run is None or target is None:
                    cells.append("—")
                    continue
                cross = crossing_iteration(run.evals, target)
                hours = (
                    models[run.config_name].timeline(run.costs()).hours_at(cross.iteration)
                    if cross.reached
                    else None
                )
                where = f"{cross.iteration:.1f}" if cross.reached else "not reached"
                cells.append(
                    f"{run.iterations} wall it.; target at {where}" + (f" ({hours:.4g} h)" if hours else "")
                )
            cells += [
                "identical" if c.evals_equal else f"DIFFER ({c.note})",
                "identical" if c.recoveries_equal else "DIFFER",
            ]
            body.append(cells)
        lines += [
            "Each real run beside its replay (validations: wall-clock iteration, effective iteration and loss, "
            "compared bit for bit):",
            "",
        ]
        lines += _table(["real run", "strategy", "real", "replay", "validations", "recoveries"], body) + [""]
    if replays.notes:
        lines += [f"- {n}" for n in replays.notes] + [""]
    return lines


def render(
    groups: list[Group],
    models: dict[str, TimingModel],
    targets: Targets,
    verdicts: list[Verdict],
    swarms: list[SwarmRun],
    skipped: list[tuple[Path, str]],
    runs: list[Run],
    plots: list[Path],
    table2: table2_md.Table2 | None = None,
    traces: traces_md.TraceReplays | None = None,
    replays: Replays | None = None,
) -> str:
    replayed = len(replays.runs) if replays else 0
    lines = [
        "# CheckFree run report",
        "",
        f"{len(runs) - replayed} simulator run(s)"
        + (f" and {replayed} replayed run(s)" if replayed else "")
        + f", {len(swarms)} swarm run(s), {len(skipped)} directory(ies) skipped. {targets.describe()}",
        "",
    ]
    lines += timing_section(models, swarms)
    for g in groups:
        m = models[g.config]
        lines += [f"## {g.title}", ""]
        ctx = rate_context(g, m)
        if ctx:
            lines += [ctx + ".", ""]
        lines += results_table(g) + ["", "Where the time went:", ""] + cost_table(g) + [""]
    lines += ["## Paper orderings at this scale", ""] + verdict_lines(verdicts)
    lines += seeds.section(groups, verdicts)
    if replays is not None:
        lines += replay_section(replays, models, targets)
    if table2 is not None:
        lines += table2_md.section(table2, targets)
    lines += swap_cost.section(groups)
    lines += recoveries.section(runs)
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += swarm_section(swarms)
    if traces is not None:
        lines += traces_md.section(traces)
    if skipped:
        lines += ["## Skipped run directories", ""] + [f"- `{p}`: {why}" for p, why in skipped] + [""]
    warn = [f"- `{r.name}`: {w}" for r in runs for w in r.warnings]
    if warn:
        lines += ["## Warnings", ""] + warn + [""]
    return "\n".join(lines)
