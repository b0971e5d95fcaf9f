"""The exact baselines by replay: checkpointing and redundant computation computed from the no-failure run.

Checkpointing (rollback to the last checkpoint, paper §5) and redundant computation (Bamboo's exact restore from
the predecessor's replica) train the no-failure trajectory by construction: a rollback restores every stage,
optimizer, RNG state and the data position, and redoes the same batches; a Bamboo restore copies the lost stage
bit for bit. Their validation curve *indexed by effective iteration* is therefore the no-failure run's, and what a
failure costs them is only wall-clock iterations (rollbacks) or a slower iteration (redundancy). This module
replays that: given the no-failure run's validation losses, the failure draws and the strategy's rule, it returns
the evaluations a real run would have written, as (wall-clock iteration, validation loss) pairs, plus the
recoveries and rollbacks, which the report turns into simulated hours like any run
(:mod:`checkfree.report.timing`).

The rules replayed are the simulator's own (:mod:`checkfree.recovery.checkpoint`, :mod:`checkfree.recovery.redundant`,
:class:`checkfree.sim.trainer.Trainer`):

* failures are drawn by wall-clock iteration ``w`` at the start of the iteration;
* ``checkpoint`` captures a checkpoint at the start of every effective iteration ``e`` with ``e % K == 0`` (and at
  the first iteration); any failure sets ``e`` back to the newest one; one recovery record per failed stage;
* ``redundant`` restores exactly unless a stage fails together with its predecessor (stage ``j − 1``, and stage
  S for stage 0), which falls back to the CheckFree rule: from that iteration on the trajectory is no longer the
  no-failure one, so a replay that meets such an iteration before the target returns ``None`` and the run must be
  made for real (:func:`redundant_fallback_iterations` says where);
* after each iteration, a validation when ``e % eval_interval == 0``, and the run stops at the first validation
  loss ≤ the target, or at the wall-clock cap (censored).

tests/report/test_replay.py checks both against real runs: the evaluations, the recoveries and the wall-clock
iterations agree exactly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checkfree.failures.injection import StageFailureSource
from checkfree.failures.rates import PAPER_ITERATION_SECONDS
from checkfree.report.runs import NOT_ENDED
from checkfree.sim.progress import DEFAULT_LIMIT_FACTOR


class ReplayError(ValueError):
    """The no-failure run cannot support the replay (an evaluation it lacks); one sentence says which."""


@dataclass
class Replayed:
    """What a replayed run would have recorded (the fields the report reads from a real run)."""

    strategy: str
    evals: list[tuple[int, int, float]] = field(default_factory=list)
    """(wall-clock iteration, effective iteration, validation loss) per validation, in order."""
    recoveries: list[tuple[int, int]] = field(default_factory=list)
    """(wall-clock iteration, stage) per recovered stage."""
    rollbacks: list[tuple[int, int, int, bool]] = field(default_factory=list)
    """(wall-clock iteration, from effective, to effective, the failed iteration lost too) per rollback
    (``checkpoint`` only; the last is the ``authors`` rule's, :func:`replay_checkpoint`)."""
    saves: list[int] = field(default_factory=list)
    """Wall-clock iterations at which a checkpoint was captured (``checkpoint`` only)."""
    wall_iterations: int = 0
    """Wall-clock iterations run until the target or the cap."""
    effective_iterations: int = 0
    reached: bool = False
    failures: int = 0
    """Stage failures drawn during the wall-clock iterations run."""

    @property
    def iterations_lost(self) -> int:
        return sum(frm - to + lost for _, frm, to, lost in self.rollbacks)


def _val(nofail: Mapping[int, float], e: int) -> float:
    try:
        return nofail[e]
    except KeyError:
        have = f"{min(nofail)}..{max(nofail)}" if nofail else "none"
        raise ReplayError(
            f"the no-failure run has no validation at effective iteration {e} (it has {have}); "
            "replays need its validations at every eval_interval up to the target."
        ) from None


def replay_checkpoint(
    nofail: Mapping[int, float],
    failures: StageFailureSource,
    every: int,
    eval_interval: int,
    target: float | None,
    max_wall_iterations: int,
    max_iterations: int | None = None,
    rule: str = "effective",
    paper_every: int = 0,
    seed: int = 0,
) -> Replayed:
    """Replay ``checkpoint`` (a rollback to the newest checkpoint at each failure) on the no-failure curve, under
    ``rule`` (:data:`checkfree.recovery.checkpoint.CHECKPOINT_RULES`): "effective", a checkpoint every ``every``
    effective iterations; "authors", one at every wall-clock multiple of ``every`` unless a failure lands on its
    boundary, and a failure in the second half of its span loses the failed iteration too
    (:func:`checkfree.recovery.checkpoint.authors_placement`, with ``paper_every`` = K_p, 0 = ``every``, and the
    run's ``seed``).

    Args:
        nofail: effective iteration → validation loss (nats) of the no-failure run, at least at every multiple of
            ``eval_interval`` until the target is reached (its iteration 0 included).
        failures: the failure source of the run (the same seed and probability as the real runs).
        every: K, effective iterations between checkpoints (≥ 1).
        target: validation loss to reach (nats); None: no stop at a loss (``--stop-at-loss`` not given).
        max_wall_iterations: the cap on wall-clock iterations (a run that hits it is censored).
        max_iterations: the cap on effective iterations (None: none).
    Raises:
        ReplayError: the no-failure run lacks a validation the replay needs.
        ValueError: ``every`` or ``eval_interval`` < 1, an unknown ``rule``, ``paper_every`` below ``every``.
    """
    from checkfree.recovery.checkpoint import Placement, authors_placement, check_rule

    if every < 1 or eval_interval < 1:
        raise ValueError(f"every {every} and eval_interval {eval_interval} must be ≥ 1.")
    check_rule(rule, every, paper_every)
    paper_every = paper_every or every
    out = Replayed("checkpoint")
    w = e = 0
    newest: int | None = None
    out.evals.append((0, 0, _val(nofail, 0)))
    out.reached = _at_target(out, target)
    while not out.reached and w < max_wall_iterations and (max_iterations is None or e < max_iterations):
        failed = failures.draw(w)
        place = Placement(False, False)
        if rule == "authors":
            place = authors_placement(seed, w, failed, every, paper_every)
            due = w % every == 0 and not place.boundary
        else:
            due = e % every == 0 and e != newest
        if newest is None or due:
            newest = e
            out.saves.append(w)
        out.failures += len(failed)
        if failed:
            out.rollbacks.append((w, e, newest, place.iteration_lost))
            out.recoveries += [(w, s) for s in failed]
            e = newest
        w, e = w + 1, e + (not place.iteration_lost)
        if e % eval_interval == 0 or e == max_iterations:
            out.evals.append((w, e, _val(nofail, e)))
            out.reached = _at_target(out, target)
    out.wall_iterations, out.effective_iterations = w, e
    return out


def redundant_fallback_iterations(
    failures: StageFailureSource, n_stages: int, wall_iterations: int
) -> list[int]:
    """Wall-clock iterations < ``wall_iterations`` in which a stage fails together with its predecessor (stage
    j − 1, stage S for stage 0): there redundant computation falls back to the CheckFree rule and leaves the
    no-failure trajectory (:mod:`checkfree.recovery.redundant`)."""
    out = []
    for w in range(wall_iterations):
        failed = set(failures.draw(w))
        if any((s - 1 if s >= 1 else n_stages) in failed for s in failed):
            out.append(w)
    return out


def replay_redundant(
    nofail: Mapping[int, float],
    failures: StageFailureSource,
    n_stages: int,
    eval_interval: int,
    target: float | None,
    max_iterations: int,
) -> Replayed | None:
    """Replay ``redundant`` (exact restores) on the no-failure curve; None when a fallback iteration comes before
    the target (the trajectory leaves the no-failure one there: make that run for real).

    Args and errors as :func:`replay_checkpoint`; ``max_iterations`` caps the run (wall = effective here).
    """
    if eval_interval < 1:
        raise ValueError(f"eval_interval {eval_interval} must be ≥ 1.")
    out = Replayed("redundant")
    out.evals.append((0, 0, _val(nofail, 0)))
    out.reached = _at_target(out, target)
    w = 0
    while not out.reached and w < max_iterations:
        failed = failures.draw(w)
        if redundant_fallback_iterations(_Fixed(failed), n_stages, 1):
            return None
        out.failures += len(failed)
        out.recoveries += [(w, s) for s in failed]
        w += 1
        if w % eval_interval == 0 or w == max_iterations:
            out.evals.append((w, w, _val(nofail, w)))
            out.reached = _at_target(out, target)
    out.wall_iterations = out.effective_iterations = w
    return out


def _at_target(out: Replayed, target: float | None) -> bool:
    return target is not None and out.evals[-1][2] <= target


class _Fixed:
    """A failure source that fails ``stages`` at iteration 0 (to reuse the fallback test on one draw)."""

    def __init__(self, stages: list[int]) -> None:
        self.stages = stages

    def draw(self, iteration: int) -> list[int]:
        return list(self.stages) if iteration == 0 else []


# ---------------------------------------------------------------------------------------------- as report runs
REPLAYED_STRATEGIES = ("checkpoint", "redundant")
"""The strategies the report can replay (their trajectory is the no-failure one)."""
FAILURE_STRATEGIES = ("checkfree", "checkfree_plus")
"""A comparison group is replayed into when it holds a run of one of these (the runs the baselines are timed
against)."""


@dataclass
class ReplayCheck:
    """A real run of a replayable strategy beside its replay on the same failures."""

    real: Any
    """The real :class:`~checkfree.report.runs.Run`."""
    replayed: Any
    """The replayed :class:`~checkfree.report.runs.Run` (None: the replay does not apply; see ``note``)."""
    evals_equal: bool
    """Every validation (wall-clock iteration, effective iteration, loss) identical, bit for bit."""
    recoveries_equal: bool
    note: str = ""


@dataclass
class Replays:
    """What :func:`replay_baselines` adds to a report."""

    runs: list[Any] = field(default_factory=list)
    """Replayed runs for the groups that lack a real run of the strategy."""
    checks: list[ReplayCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """One sentence per group that could not be replayed, and why."""
    superseded: list[Any] = field(default_factory=list)
    """Real checkpoint runs of another rule than the report's: checked against their replay, and left out of the
    comparisons, where a replay under the report's rule takes their place."""


def _eval_records(run: Any) -> list[tuple[int, int, float]]:
    return [
        (int(r["iteration"]), int(r.get("effective_iteration", r["iteration"])), float(r["val_loss"]))
        for r in run.kind("eval")
    ]


def _option(run: Any, key: str) -> Any:
    value = run.options.get(key)
    return run.config.get(key) if value is None else value


def _parameters(config: Mapping[str, Any], vocab: int) -> int:
    from checkfree.report.timing import stage_parameter_count

    per_stage = stage_parameter_count(
        str(config.get("architecture", "LLaMa")), int(config["dmodel"]), int(config["n_layers_per_stage"])
    )
    return int(config["n_stages"]) * per_stage + 2 * vocab * int(config["dmodel"]) + int(config["dmodel"])


def _as_run(
    rep: Replayed,
    member: Any,
    nofail: Any,
    target: float | None,
    every: tuple[int, str, int] | None,
    stall: float,
    forward: float | None,
) -> Any:
    """A :class:`~checkfree.report.runs.Run` holding what ``rep`` would have written: eval, recovery, rollback and
    checkpoint records, a summary, the member run's options and config. ``every``: (K, rule, K_p) of a checkpoint run; ``stall``: seconds per checkpoint save;
    ``forward``: redundant forward seconds per microbatch measured by real redundant runs (None: none)."""
    from checkfree.report.runs import Run

    records: list[dict[str, Any]] = []
    for w, e, loss in rep.evals:
        records.append({"kind": "eval", "iteration": w, "effective_iteration": e, "val_loss": loss})
    for w in rep.saves:
        records.append(
            {"kind": "checkpoint", "iteration": w, "purpose": "strategy", "stall_seconds": stall, "bytes": 0}
        )
    for w, frm, to, lost in rep.rollbacks:
        records.append(
            {
                "kind": "rollback",
                "iteration": w,
                "from_effective_iteration": frm,
                "to_effective_iteration": to,
                "iterations_lost": frm - to + lost,
                "failed_iteration_lost": lost,
            }
        )
    for w, stage in rep.recoveries:
        records.append({"kind": "recovery", "iteration": w, "stage": stage, "strategy": rep.strategy})
    records.sort(key=lambda r: r["iteration"])
    last = rep.evals[-1]
    swaps_off = dict(member.options, setting=rep.strategy, swaps=False)
    name = member.name
    for s in FAILURE_STRATEGIES[::-1]:  # tiny_6x2-r5-checkfree_plus-s0 → tiny_6x2-r5-checkpoint-s0 (replayed)
        name = name.replace(s, rep.strategy)
    if name == member.name:
        name = f"{member.name}-{rep.strategy}"
    stats: dict[str, Any] = {"replayed_from": nofail.name}
    if rep.strategy == "redundant" and forward is not None:
        stats["redundant_forward_seconds_per_microbatch"] = forward
    if every is not None:
        stats |= {
            "checkpoint_every": every[0],
            "checkpoint_rule": every[1],
            "checkpoint_paper_interval": every[2],
            "rollbacks": len(rep.rollbacks),
            "iterations_lost": rep.iterations_lost,
        }
    summary = {
        "status": "completed",
        "strategy": rep.strategy,
        "setting": rep.strategy,
        "swaps": False,
        "failure_rate_per_hour": member.rate,
        "failure_probability": member.p_iter,
        "world_size": member.world_size,
        "config": member.summary.get("config", member.options.get("config")),
        "iterations": rep.wall_iterations,
        "effective_iterations": rep.effective_iterations,
        "failures": rep.failures,
        "recoveries": len(rep.recoveries),
        "fallbacks": 0,
        "final_eval": {
            "iteration": last[0],
            "val_loss": last[2],
            "perplexity": math.exp(min(last[2], 700.0)),
        },
        "ended_by": "target" if rep.reached else "max_wall_iterations",
        "target": {"loss": target, "reached": rep.reached, "iteration": rep.wall_iterations},
        "strategy_stats": stats,
        "replayed": True,
    }
    path = nofail.path.parent / f"{name} (replayed)"
    return Run(path, summary, dict(member.config), swaps_off, records, [f"replayed from {nofail.name}"])


def paper_checkpoint_interval(every: int, iteration_seconds: float | None) -> int:
    """K_p for a replay of the ``authors`` rule: the paper iterations K = ``every`` of ours stand for when one of
    ours lasts ``iteration_seconds`` on the paper's clock (3 × 3,044 s / 91.32 s = 100 for Table 2's study);
    ``every`` itself without a clock."""
    if iteration_seconds is None:
        return every
    return max(every, round(every * iteration_seconds / PAPER_ITERATION_SECONDS))


def replay_baselines(
    runs: list[Any],
    targets: Any,
    rule: str = "authors",
    iteration_seconds: float | None = None,
) -> Replays:
    """Replay ``checkpoint`` and ``redundant`` into every comparison group that holds a CheckFree or CheckFree+
    run and a no-failure (no swaps) run of its seed; a group that has a real run of the strategy keeps it and
    gets a :class:`ReplayCheck` instead.

    The replay follows the group's CheckFree runs: the same failure draws (probability, failure seed, stage 0 or
    not), validations every ``eval_interval`` of those runs, and their cap (``max_iterations``) as the cap on
    wall-clock iterations. ``targets`` is the report's :class:`~checkfree.report.analysis.Targets`. The save
    stall of each replayed checkpoint is the median stall per save of the real checkpoint runs of the config
    (0 without one); a replayed redundant run carries the median redundant forward time the real redundant runs
    of the config measured (none: the timing model uses the paper's ratio). A real run is checked against the
    replay of what it was told (its cap, its ``--stop-at-loss``, its K, its checkpoint rule and K_p).

    A replayed checkpoint run follows ``rule`` ("authors", the default, or "effective";
    :func:`replay_checkpoint`), the authors' at K_p = :func:`paper_checkpoint_interval` of ``iteration_seconds``
    (the paper's clock, ``--iteration-seconds``), its failures placed by the run's seed.
    """
    from checkfree.failures.injection import StageFailureInjector
    from checkfree.recovery.checkpoint import paper_interval
    from checkfree.report.analysis import group_key

    out = Replays()
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    nofail = {
        (r.config_name, r.failure_seed, r.world_size): r
        for r in sorted(runs, key=lambda r: r.name, reverse=True)
        if r.strategy == "no_failure" and not r.swaps and not r.options.get("failure_schedule")
    }
    stalls: dict[str, list[float]] = {}
    forwards: dict[str, list[float]] = {}
    for r in runs:
        if r.strategy == "checkpoint":
            stalls.setdefault(r.config_name, []).extend(
                _num(x.get("stall_seconds")) for x in r.kind("checkpoint")
            )
        f = _num((r.summary.get("strategy_stats") or {}).get("redundant_forward_seconds_per_microbatch"))
        if r.strategy == "redundant" and math.isfinite(f):
            forwards.setdefault(r.config_name, []).append(f)
    for key, members in groups.items():
        config, _, seed, world, schedule = key
        member = next((r for r in members if r.strategy in FAILURE_STRATEGIES), None)
        base = nofail.get((config, seed, world))
        target = targets.of(config, seed, world)
        if member is None or schedule or base is None or target is None:
            if member is not None:
                why = (
                    "a failure schedule"
                    if schedule
                    else "no no-failure run of its seed"
                    if base is None
                    else "no target"
                )
                out.notes.append(f"{member.name}: the baselines are not replayed ({why}).")
            continue
        curve = {e: loss for e, loss in base.evals_by_effective}
        n_stages = int(member.config["n_stages"])
        source = StageFailureInjector(
            n_stages, member.p_iter, int(seed), include_stage0=bool(member.options.get("fail_stage0"))
        )
        every = int(member.config.get("checkpoint_every") or 0) or paper_interval(
            _parameters(
                member.config, int(member.summary.get("vocab_size") or member.config.get("vocab_size", 0))
            )
        )
        model_seed = int(member.config.get("seed", 0))  # the strategy's seed places the failures
        finite = [x for x in stalls.get(config, []) if math.isfinite(x)]
        stall = statistics.median(finite) if finite else 0.0
        forward = statistics.median(forwards[config]) if forwards.get(config) else None
        real = {r.strategy: r for r in members if r.strategy in REPLAYED_STRATEGIES and not r.swaps}
        for strategy in REPLAYED_STRATEGIES:
            in_place = (target, int(_option(member, "max_iterations")), None)
            ours = (every, rule, paper_checkpoint_interval(every, iteration_seconds))
            if strategy not in real:  # a replay in its place: the group's target, the CheckFree runs' cap
                jobs = [("place", member, in_place, ours)]
            else:  # the check: replay exactly what the real run was told
                like = real[strategy]
                max_its = int(_option(like, "max_iterations"))
                wall_cap = like.options.get("max_wall_iterations") or DEFAULT_LIMIT_FACTOR * max_its
                told = like.summary.get("strategy_stats") or {}
                k = int(told.get("checkpoint_every") or every)
                how = str(
                    told.get("checkpoint_rule") or "effective"
                )  # runs before the rule existed: effective
                rule_told = (k, how, int(told.get("checkpoint_paper_interval") or k))
                jobs = [
                    ("check", like, (like.options.get("stop_at_loss"), max_its, int(wall_cap)), rule_told)
                ]
                if strategy == "checkpoint" and rule_told != ours and not like.partial:
                    jobs.append(("place", member, in_place, ours))  # the table follows the report's rule
                    out.superseded.append(like)
                    out.notes.append(
                        f"{like.name} ({how} rule) is checked against its replay; the table holds the "
                        f"{rule} rule's replay in its place (K {every}, K_p {ours[2]})."
                    )
            for job, like, (stop, max_its, wall_cap), (k, how, k_paper) in jobs:
                eval_interval = int(_option(like, "eval_interval"))
                try:
                    if strategy == "checkpoint":
                        cap = max_its if wall_cap is None else wall_cap
                        rep = replay_checkpoint(
                            curve, source, k, eval_interval, stop, cap, max_its, how, k_paper, model_seed
                        )
                    else:
                        rep = replay_redundant(curve, source, n_stages, eval_interval, stop, max_its)
                except ReplayError as e:
                    out.notes.append(f"{like.name}: {strategy} not replayed: {e}")
                    continue
                rule_of = (k, how, k_paper) if strategy == "checkpoint" else None
                as_run = None if rep is None else _as_run(rep, member, base, stop, rule_of, stall, forward)
                if job == "check" and like.partial:  # it has not ended
                    out.notes.append(
                        f"{like.name}: has not ended ({NOT_ENDED}): not compared with its replay."
                    )
                elif job == "check":
                    out.checks.append(_check(like, as_run))
                elif as_run is not None:
                    out.runs.append(as_run)
                else:
                    out.notes.append(
                        f"{member.name}: redundant computation falls back (a stage fails with its predecessor) "
                        "before the target, so it cannot be replayed; run it."
                    )
    return out


def _check(real: Any, replayed: Any) -> ReplayCheck:
    if replayed is None:
        return ReplayCheck(real, None, False, False, "a fallback before the target: no replay to compare")
    real_rec = sorted((int(r["iteration"]), int(r["stage"])) for r in real.kind("recovery"))
    rep_rec = sorted((int(r["iteration"]), int(r["stage"])) for r in replayed.kind("recovery"))
    a, b = _eval_records(real), _eval_records(replayed)
    note = ""
    if a != b:
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        note = f"first difference at validation {first}: real {a[first] if first < len(a) else '—'}, replay {b[first] if first < len(b) else '—'}"
    return ReplayCheck(real, replayed, a == b, real_rec == rep_rec, note)


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
