"""``python -m checkfree report RUN_DIR... --target-loss L --out DIR``: tables, plots and the paper's orderings.

Writes ``DIR/report.md`` and PNG plots from simulator run directories (and swarm run directories holding
throughput.json): one row per run with failures, recoveries, final validation loss, iterations and simulated
hours to the target loss and the speed-up versus ``checkpoint`` on the same failures (see checkfree.report.timing for the
wall-clock model). Malformed or partial directories are reported and skipped, never fatal.
"""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from checkfree.recovery.checkpoint import CHECKPOINT_RULES
from checkfree.report.analysis import (
    NOFAIL_PREFIX,
    Group,
    Targets,
    TimingOptions,
    Verdict,
    analyse,
    fig2_verdict,
    fig4c_verdict,
    resolve_targets,
    table2_verdicts,
    timing_models,
)
from checkfree.report.replay import Replays, replay_baselines
from checkfree.report.runs import Run, SwarmRun, load_runs
from checkfree.report.table2 import Table2, summarise
from checkfree.report.timing import REDUNDANT_RATIO_SOURCES
from checkfree.report.traces import TraceReplays, collect
from checkfree.rundir import check_output_dir, claim_output_dir

log = logging.getLogger(__name__)

__all__ = ["REPORT_MARKER", "ReportResult", "add_parser", "build_report"]

REPORT_MARKER = "checkfree_report.json"
"""Written first into a report directory (run directories, target, the trace-replay rows of
checkfree.report.traces): marks it as a report that may be replaced."""


@dataclass
class ReportResult:
    """What :func:`build_report` produced."""

    report: Path
    plots: list[Path]
    groups: list[Group]
    verdicts: list[Verdict]
    runs: list[Run]
    swarms: list[SwarmRun]
    skipped: list[tuple[Path, str]]
    target: float
    table2: Table2 = field(default_factory=lambda: Table2({}))
    """Paper Table 2's numbers at this scale, per recovery-cost factor (checkfree.report.table2)."""
    traces: TraceReplays = field(default_factory=TraceReplays)
    """Rows of the runs that replayed a preemption trace (checkfree.report.traces)."""
    targets: Targets | None = None
    """The target of every comparison group (one number, or one per seed)."""
    replays: Replays = field(default_factory=Replays)
    """The replayed exact baselines and their checks against real runs (checkfree.report.replay)."""


def build_report(
    run_dirs: list[Path],
    target_loss: float | str,
    out: Path,
    timing: TimingOptions | None = None,
    plots: bool = True,
    replay: bool = False,
    checkpoint_rule: str = "authors",
) -> ReportResult:
    """Read ``run_dirs``, write ``out/report.md`` and its PNGs.

    Args:
        target_loss: validation loss (nats) to reach, "auto" or "nofail@N" (per seed; see
            :func:`analysis.resolve_targets`).
        plots: write the PNGs (the tables alone are much faster).
        replay: add checkpointing and redundant computation computed by replay from each seed's no-failure run
            where no real run exists, and check the real ones against their replay (checkfree.report.replay).
        checkpoint_rule: the rule of a replayed checkpoint run, "authors" (the default: the authors'
            checkpoint_simulation.py at the granularity of ``timing.iteration_seconds`` on the paper's clock) or
            "effective" (checkfree.recovery.checkpoint).
    ``out`` must be new, empty or an earlier report (recognised by :data:`REPORT_MARKER`); it is checked before
    anything is read.

    Raises:
        DirectoryConflictError: ``out`` is a file or a non-empty directory that is not an earlier report.
        ValueError: no usable simulator run or swarm run among ``run_dirs``, "auto" without a no_failure run,
            a target loss that is not a positive number, or an unknown ``checkpoint_rule``.
    """
    from checkfree.report import markdown

    out = Path(out)
    if checkpoint_rule not in CHECKPOINT_RULES:
        raise ValueError(
            f"--checkpoint-rule is {checkpoint_rule!r}; expected one of {list(CHECKPOINT_RULES)}."
        )
    check_output_dir(out, REPORT_MARKER, "report")
    if not isinstance(target_loss, str) and not (math.isfinite(target_loss) and target_loss > 0):
        raise ValueError(
            f"--target-loss is {target_loss}; expected a positive validation loss (nats) or 'auto'."
        )
    runs, swarms, skipped = load_runs([Path(p) for p in run_dirs])
    if not runs and not swarms:
        reasons = "; ".join(f"{p}: {why}" for p, why in skipped) or "no directories given"
        raise ValueError(f"no usable run directory among the {len(run_dirs)} given ({reasons}).")
    targets = resolve_targets(runs, target_loss)
    timing = timing or TimingOptions()
    models = timing_models(runs, swarms, timing)
    replays = (
        replay_baselines(runs, targets, checkpoint_rule, timing.iteration_seconds) if replay else Replays()
    )
    runs = [r for r in runs if not any(r is x for x in replays.superseded)] + replays.runs
    groups = analyse(runs, models, targets)
    verdicts = fig2_verdict(groups) + table2_verdicts(groups) + fig4c_verdict(runs)
    table2 = summarise(groups, runs, models, targets)
    traces = collect(runs, swarms)
    claim_output_dir(
        out,
        REPORT_MARKER,
        {
            "run_dirs": [str(Path(p).resolve()) for p in run_dirs],
            "target": targets.to_json(),
            "replayed_runs": [r.name for r in replays.runs],
            "trace_replays": traces.to_json(),
        },
    )
    pngs: list[Path] = []
    if groups and plots:
        from checkfree.report import plots as plotting

        refs = {}
        for r in runs:
            if r.strategy == "no_failure" and not r.swaps:
                refs.setdefault((r.config_name, r.failure_seed, r.world_size), r)
        pngs += plotting.validation_plots(groups, refs, out)
        pngs += [plotting.training_plot(g, out) for g in groups]
        pngs += [p for p in [plotting.recovery_plot(runs, out)] if p is not None]
    text = markdown.render(
        groups,
        models,
        targets,
        verdicts,
        swarms,
        skipped,
        runs,
        pngs,
        table2=table2,
        traces=traces,
        replays=replays,
    )
    report = out / "report.md"
    report.write_text(text, encoding="utf-8")
    log.debug(
        "report: %s (%d runs, %d swarm runs, %d skipped, %d plots)",
        report,
        len(runs),
        len(swarms),
        len(skipped),
        len(pngs),
    )
    return ReportResult(
        report,
        pngs,
        groups,
        verdicts,
        runs,
        swarms,
        skipped,
        targets.headline,
        table2,
        traces,
        targets,
        replays,
    )


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _target(text: str) -> float | str:
    if text == "auto" or (text.startswith(NOFAIL_PREFIX) and text[len(NOFAIL_PREFIX) :].isdigit()):
        return text
    try:
        return _positive(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number, 'auto' or 'nofail@N'") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``report`` sub-command."""
    p = sub.add_parser(
        "report",
        help="tables, plots and the paper's orderings from run directories",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "run_dirs",
        nargs="+",
        type=Path,
        metavar="RUN_DIR",
        help="run directories (a directory of run directories stands for all of them)",
    )
    p.add_argument(
        "--target-loss",
        default="auto",
        type=_target,
        help="validation loss (nats) to reach; 'auto' (default) = the no_failure run's loss at 75%% "
        "of training; 'nofail@N' = per seed, that seed's no_failure run (no swaps) at effective iteration N",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory for report.md and the PNGs")
    p.add_argument(
        "--iteration-seconds",
        type=_positive,
        help="T_iter (s) for every strategy (default: swarm measured, else the docs/paper.md §5 formula)",
    )
    p.add_argument(
        "--forward-seconds",
        type=_positive,
        help="T_fwd (s) of the formula (default: measured compute seconds / 2.5)",
    )
    p.add_argument(
        "--recovery-seconds",
        type=_positive,
        help="seconds per stage recovery (default: swarm measured, else the paper's 30 s / 91.32 s ratio)",
    )
    p.add_argument(
        "--redundant-ratio",
        choices=REDUNDANT_RATIO_SOURCES,
        default="measured",
        help="redundant computation's iteration-time ratio: measured (default; the paper's when a run timed "
        "none) or paper (151.04 s / 91.32 s)",
    )
    p.add_argument(
        "--replay-baselines",
        action="store_true",
        help="compute checkpointing and redundant computation by replay from each seed's no_failure run where "
        "no real run exists, and check real runs against their replay (docs/reports.md)",
    )
    p.add_argument(
        "--checkpoint-rule",
        choices=CHECKPOINT_RULES,
        default="authors",
        help="a replayed checkpoint run's rule: authors (default; the authors' checkpoint_simulation.py, "
        "checkpoints at wall-clock multiples of K, each failure placed at a paper iteration when "
        "--iteration-seconds puts an iteration on the paper's clock) or effective (every K effective iterations)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    res = build_report(
        args.run_dirs,
        args.target_loss,
        args.out,
        TimingOptions(
            args.iteration_seconds, args.forward_seconds, args.recovery_seconds, args.redundant_ratio
        ),
        replay=args.replay_baselines,
        checkpoint_rule=args.checkpoint_rule,
    )
    for p, why in res.skipped:
        print(f"skipped {p}: {why}")
    mark = {True: "holds", False: "DOES NOT HOLD", None: "not judged"}
    for v in res.verdicts:
        print(f"{mark[v.holds]}: {v.claim}")
    print(f"wrote {res.report} and {len(res.plots)} plot(s)")
    return 0
