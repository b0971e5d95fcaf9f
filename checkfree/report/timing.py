"""The wall-clock model: from a run's metrics to simulated hours, and the time to a target validation loss.

The paper's claims are about wall-clock time to a target loss (docs/paper.md §5, §7: Table 2 = iterations to loss 2.85 ×
the measured iteration time). A simulator run on a CPU measures convergence per iteration, not the time a
geo-distributed deployment would take, so this module turns a run into simulated hours:

    hours(x) = [ x · T_strategy + Σ recovery seconds + Σ save / snapshot stalls  (events before position x) ] / 3600

* ``x`` counts wall-clock iterations (metrics' ``iteration``). Iterations a checkpoint rollback redoes are wall-clock
  iterations too, so rollback costs its redone time naturally.
* ``T_strategy = T_iter`` for every strategy except redundant computation (Bamboo), which costs
  ``T_iter × ratio``: the measured ``redundant_forward_seconds_per_microbatch`` relative to the measured compute
  seconds when the run recorded it, else the paper's 151.04 s / 91.32 s (docs/paper.md §5).
* ``T_iter`` is one of (highest priority first): an explicit number; the mean iteration time a swarm experiment
  measured; the authors' formula (docs/paper.md §5, :class:`IterationTimeFormula`) on the run's config with ``T_fwd``
  estimated from the run's measured compute seconds.
* Recovery seconds per recovered stage: explicit; a swarm's measured crash → serving latency; else the paper's
  ≈30 s at its 91.32 s iteration, as a ratio (30 / 91.32 of T_iter) so the cost keeps the paper's proportion at
  any model scale.

The failure-rate conversion (%/h ↔ per-iteration probability, docs/paper.md §1) lives in
:mod:`checkfree.failures.rates`; ``hourly_rate`` and ``per_iteration_probability`` are re-exported here for the
report's modules.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from checkfree.failures.rates import PAPER_ITERATION_SECONDS, hourly_rate, per_iteration_probability
from checkfree.recovery.record import LATENCY_KEY

GIB = 2**30
PAPER_CHECKPOINT_ITERATION_SECONDS = 91.35
"""Iteration time (s) of the 500M model with asynchronous checkpoint sends (paper §5 / docs/paper.md §5)."""
PAPER_REDUNDANT_ITERATION_SECONDS = 151.04
"""Iteration time (s) of redundant computation on the 500M model (paper §5 / docs/paper.md §5)."""
PAPER_REDUNDANT_RATIO = PAPER_REDUNDANT_ITERATION_SECONDS / PAPER_ITERATION_SECONDS
"""≈ 1.654: redundant computation's iteration time relative to plain pipeline training (paper)."""
REDUNDANT_RATIO_SOURCES = ("measured", "paper")
"""Where redundant computation's iteration-time ratio comes from (:attr:`TimingModel.redundant_source`)."""
PAPER_RECOVERY_SECONDS = 30.0
"""Seconds to recover one stage in the authors' geo-distributed testbed (paper §5.3 / docs/paper.md §7)."""


# ---------------------------------------------------------------------------------------------- the formula
@dataclass(frozen=True)
class IterationTimeFormula:
    """The authors' iteration-time estimate (docs/paper.md §5, printed by their convergence simulator):

    ``T_iter = backward_factor · waves · (T_fwd + (S+1)·B·d·L·bytes / (activation_bandwidth·2³⁰))
              + (2W−1)·P_stage·bytes / (dp_bandwidth·2³⁰)``

    The defaults are the authors' constants; each is a rough assumption of theirs, kept configurable.
    """

    backward_factor: float = 2.5
    """Forward + backward time as a multiple of the forward time ("backwards is a bit slower")."""
    waves: float = 2.0
    """Multiplier for pipeline waves ("in reality you will do multiple waves")."""
    bytes_per_element: float = 8.0
    """Bytes per activation / parameter element sent over the network."""
    activation_bandwidth_gib_s: float = 0.1
    """Bandwidth (GiB/s) for activations between consecutive stages (≈100 MB/s)."""
    dp_bandwidth_gib_s: float = 0.2
    """Bandwidth (GiB/s) of the data-parallel gradient exchange between replicas of a stage."""

    def components(
        self,
        forward_seconds: float,
        n_stages: int,
        batch_size: int,
        dmodel: int,
        seq_l: int,
        world_size: int,
        stage_parameters: int,
    ) -> dict[str, float]:
        """Seconds of the formula's parts: "compute", "activations", "data_parallel" and their "total".

        Args:
            forward_seconds: T_fwd, no-grad forward time (s) of one iteration's microbatches through all stages.
            n_stages: transformer stages S (the activation term counts S+1 hops, stage 0 included).
            batch_size, dmodel, seq_l: microbatch size B, model width d, sequence length L.
            world_size: data-parallel replicas W per stage.
            stage_parameters: P_stage, parameters of one transformer stage.
        Raises:
            ValueError: a negative time or a non-positive size.
        """
        if not (forward_seconds >= 0 and math.isfinite(forward_seconds)):
            raise ValueError(f"forward time {forward_seconds!r} s is invalid; expected a finite number ≥ 0.")
        for name, v in (
            ("n_stages", n_stages),
            ("batch_size", batch_size),
            ("dmodel", dmodel),
            ("seq_l", seq_l),
            ("world_size", world_size),
            ("stage_parameters", stage_parameters),
        ):
            if v <= 0:
                raise ValueError(f"{name} is {v!r}; the iteration-time formula needs a positive value.")
        activation_bytes = (n_stages + 1) * batch_size * dmodel * seq_l * self.bytes_per_element
        activations = activation_bytes / (self.activation_bandwidth_gib_s * GIB)
        compute = self.backward_factor * self.waves * forward_seconds
        comm = self.backward_factor * self.waves * activations
        dp = (
            (2 * world_size - 1) * stage_parameters * self.bytes_per_element / (self.dp_bandwidth_gib_s * GIB)
        )
        return {"compute": compute, "activations": comm, "data_parallel": dp, "total": compute + comm + dp}

    def seconds(
        self,
        forward_seconds: float,
        n_stages: int,
        batch_size: int,
        dmodel: int,
        seq_l: int,
        world_size: int,
        stage_parameters: int,
    ) -> float:
        """T_iter in seconds (see the class docstring and :meth:`components`)."""
        return self.components(
            forward_seconds, n_stages, batch_size, dmodel, seq_l, world_size, stage_parameters
        )["total"]

    def forward_seconds_from_compute(self, compute_seconds: float) -> float:
        """T_fwd estimated from a measured forward + backward time (s): ``compute / backward_factor``."""
        return compute_seconds / self.backward_factor


def stage_parameter_count(architecture: str, dmodel: int, n_layers_per_stage: int) -> int:
    """Parameters of one transformer stage (checkfree.model's blocks, MLP hidden 4·d, no biases for LLaMa).

    LLaMa block: attention 4d² + SwiGLU 3·d·4d + two RMSNorms 2d = 16d² + 2d.
    GPT-2 block: attention 4d² + 4d, MLP 8d² + 5d, two LayerNorms 4d = 12d² + 13d.
    Raises ValueError for an unknown architecture.
    """
    d = dmodel
    if architecture == "LLaMa":
        per_block = 16 * d * d + 2 * d
    elif architecture == "GPT":
        per_block = 12 * d * d + 13 * d
    else:
        raise ValueError(f"architecture {architecture!r} is unknown; expected 'LLaMa' or 'GPT'.")
    return n_layers_per_stage * per_block


def implied_iteration_seconds(rate_percent_per_hour: float, p_iter: float) -> float:
    """The iteration time (s) at which ``p_iter`` per iteration equals ``rate_percent_per_hour`` (docs/paper.md §1).

    Solves ``p_iter = 1 − (1 − h/100) ** (T/3600)`` for T; ``inf`` when p_iter = 0 and h > 0.
    Raises ValueError when the rate is not in (0, 100) or p_iter not in [0, 1).
    """
    if not 0 < rate_percent_per_hour < 100:
        raise ValueError(
            f"failure rate {rate_percent_per_hour!r} %/h is invalid; expected a number in (0, 100)."
        )
    if not 0 <= p_iter < 1:
        raise ValueError(
            f"per-iteration failure probability {p_iter!r} is invalid; expected a number in [0, 1)."
        )
    if p_iter == 0:
        return math.inf
    return 3600.0 * math.log1p(-p_iter) / math.log1p(-rate_percent_per_hour / 100.0)


def redundant_ratio(
    forward_seconds_per_microbatch: float | None,
    mb_count: int,
    compute_seconds: float | None,
    n_stages: int = 1,
) -> tuple[float, str]:
    """Iteration-time ratio of redundant computation and where it came from.

    Measured: ``1 + S · mb_count · f / C`` with f the redundant forward seconds per microbatch of the slowest
    stage (Bamboo: every stage also runs its successor's forward on each microbatch) and C the measured compute
    seconds of one iteration through all stages, one after the other, as the simulator runs them. In a balanced
    pipeline the S stages work in parallel, so the extra work S·mb·f over the total C is each stage's extra time
    over its own. Otherwise the paper's 151.04 s / 91.32 s (which also includes Bamboo's halved microbatches).
    """
    if (
        forward_seconds_per_microbatch is not None
        and compute_seconds
        and compute_seconds > 0
        and forward_seconds_per_microbatch >= 0
    ):
        ratio = 1.0 + n_stages * mb_count * forward_seconds_per_microbatch / compute_seconds
        return ratio, (
            f"measured: {n_stages} stages × {mb_count} microbatches × {forward_seconds_per_microbatch:.4g} s "
            f"redundant forward / {compute_seconds:.4g} s compute per iteration"
        )
    return PAPER_REDUNDANT_RATIO, (
        f"paper: {PAPER_REDUNDANT_ITERATION_SECONDS} s / {PAPER_ITERATION_SECONDS} s "
        "(no measured redundant forward time)"
    )


__all__ = [
    "PAPER_CHECKPOINT_ITERATION_SECONDS",
    "PAPER_ITERATION_SECONDS",
    "PAPER_RECOVERY_SECONDS",
    "PAPER_REDUNDANT_ITERATION_SECONDS",
    "PAPER_REDUNDANT_RATIO",
    "Crossing",
    "IterationTimeFormula",
    "RunCosts",
    "RunTimeline",
    "TimingModel",
    "crossing_iteration",
    "hourly_rate",
    "implied_iteration_seconds",
    "per_iteration_probability",
    "redundant_ratio",
    "stage_parameter_count",
]


# ---------------------------------------------------------------------------------------------- run costs
def _num(value: Any, default: float = 0.0) -> float:
    """A metrics number as a float (:func:`checkfree.telemetry.metrics.read_metrics` has put NaN/inf back);
    ``default`` when missing or not a number."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out


@dataclass
class RunCosts:
    """The per-strategy costs one run recorded (metrics.jsonl + summary.json), in seconds and bytes."""

    strategy: str
    mb_count: int = 1
    n_stages: int = 1
    """Transformer stages S (for the redundant-computation ratio)."""
    iterations: int = 0
    """Wall-clock iterations run (rolled-back iterations included)."""
    compute_seconds: list[float] = field(default_factory=list)
    """Measured seconds of each training iteration (forward + backward + step), as the simulator timed it."""
    recoveries: list[tuple[int, float]] = field(default_factory=list)
    """(iteration, measured seconds: the record's ``latency_s``) per recovered stage."""
    save_stalls: list[tuple[int, float]] = field(default_factory=list)
    """(iteration, stall seconds) per strategy checkpoint save (not the simulator's own resume checkpoints)."""
    snapshot_stalls: list[tuple[int, float]] = field(default_factory=list)
    """(iteration, stall seconds) per snapshot (erasure-coded snapshots)."""
    save_bytes: int = 0
    snapshot_bytes: int = 0
    parity_bytes: int = 0
    iterations_lost: int = 0
    """Iterations redone after rollbacks."""
    rollbacks: int = 0
    redundant_forward_seconds_per_microbatch: float | None = None

    @property
    def median_compute_seconds(self) -> float | None:
        """Median measured compute seconds per iteration (robust to a noisy shared machine); None without any."""
        values = [s for s in self.compute_seconds if s > 0 and math.isfinite(s)]
        return statistics.median(values) if values else None

    @classmethod
    def from_records(
        cls,
        records: Iterable[Mapping[str, Any]],
        summary: Mapping[str, Any] | None = None,
        mb_count: int = 1,
        n_stages: int = 1,
    ) -> RunCosts:
        """Collect the costs from metrics records (the metrics contract; missing fields count as 0)."""
        summary = summary or {}
        stats = summary.get("strategy_stats") or {}
        costs = cls(strategy=str(summary.get("strategy", "")), mb_count=mb_count, n_stages=n_stages)
        max_iter = -1
        for r in records:
            kind, it = r.get("kind"), int(_num(r.get("iteration"), -1))
            if kind == "train":
                max_iter = max(max_iter, it)
                costs.compute_seconds.append(_num(r.get("seconds"), math.nan))
            elif kind == "recovery":
                costs.recoveries.append((it, _num(r.get(LATENCY_KEY))))
            elif kind == "checkpoint" and r.get("purpose") == "strategy":
                stall = r.get(
                    "stall_seconds", r.get("seconds")
                )  # a save that reports no stall is assumed to block
                costs.save_stalls.append((it, _num(stall)))
                costs.save_bytes += int(_num(r.get("bytes")))
            elif kind == "snapshot":
                costs.snapshot_stalls.append((it, _num(r.get("stall_seconds"))))
                costs.snapshot_bytes += int(_num(r.get("bytes")))
                costs.parity_bytes += int(_num(r.get("parity_bytes")))
            elif kind == "rollback":
                costs.rollbacks += 1
                costs.iterations_lost += int(_num(r.get("iterations_lost")))
        costs.iterations = int(summary.get("iterations", max_iter + 1) or 0)
        rf = stats.get("redundant_forward_seconds_per_microbatch")
        costs.redundant_forward_seconds_per_microbatch = None if rf is None else _num(rf, math.nan)
        if costs.redundant_forward_seconds_per_microbatch is not None and not math.isfinite(
            costs.redundant_forward_seconds_per_microbatch
        ):
            costs.redundant_forward_seconds_per_microbatch = None
        return costs


# ---------------------------------------------------------------------------------------------- the model
@dataclass
class RunTimeline:
    """Simulated wall-clock seconds of one run as a function of the wall-clock iteration position."""

    iteration_seconds: float
    """This run's seconds per iteration (T_iter, × the redundant ratio for redundant computation)."""
    ratio: float = 1.0
    ratio_source: str = ""
    events: list[tuple[float, float, str]] = field(default_factory=list)
    """(position, seconds, kind) with kind "recovery" | "save_stall" | "snapshot_stall"; an event at
    iteration i happens before iteration i runs (after i iterations completed)."""

    def breakdown(self, x: float) -> dict[str, float]:
        """Simulated seconds spent up to position ``x`` (iterations), by kind, plus "iterations" and "total"."""
        out = {
            "iterations": x * self.iteration_seconds,
            "recovery": 0.0,
            "save_stall": 0.0,
            "snapshot_stall": 0.0,
        }
        for pos, sec, kind in self.events:
            if pos < x:
                out[kind] += sec
        out["total"] = sum(out.values())
        return out

    def seconds_at(self, x: float) -> float:
        """Simulated seconds after ``x`` wall-clock iterations (fractional positions interpolate)."""
        return self.breakdown(x)["total"]

    def hours_at(self, x: float) -> float:
        """Simulated hours after ``x`` wall-clock iterations."""
        return self.seconds_at(x) / 3600.0


@dataclass
class TimingModel:
    """Base iteration time, recovery cost and redundant-computation ratio shared by every run of a comparison.

    Build one with :meth:`resolve`; every field says where its value came from, for the report.
    """

    iteration_seconds: float
    iteration_source: str
    recovery_seconds: float
    recovery_source: str
    baseline_compute_seconds: float | None = None
    """Measured compute seconds per iteration of the non-redundant runs (for the measured redundant ratio)."""
    formula: IterationTimeFormula = field(default_factory=IterationTimeFormula)
    redundant_source: str = "measured"
    """Redundant computation's iteration-time ratio: "measured" (from the run's timed redundant forward when it
    recorded one, else the paper's) or "paper" (151.04 s / 91.32 s always, e.g. on the paper's clock)."""

    @classmethod
    def resolve(
        cls,
        *,
        explicit_iteration_seconds: float | None = None,
        swarm_iteration_seconds: float | None = None,
        formula_inputs: Mapping[str, Any] | None = None,
        compute_seconds: float | None = None,
        explicit_recovery_seconds: float | None = None,
        swarm_recovery_seconds: float | None = None,
        formula: IterationTimeFormula | None = None,
        redundant: str = "measured",
    ) -> TimingModel:
        """Pick T_iter and the recovery seconds by priority (module docstring).

        Args:
            formula_inputs: n_stages, batch_size, dmodel, seq_l, world_size, stage_parameters, and optionally
                forward_seconds (else estimated from ``compute_seconds``).
            compute_seconds: measured forward + backward seconds per iteration (median over runs).
            redundant: "measured" or "paper" (:attr:`redundant_source`).
        Raises:
            ValueError: no source gives an iteration time, a given value is not a positive number, or an
                unknown ``redundant``.
        """
        if redundant not in REDUNDANT_RATIO_SOURCES:
            raise ValueError(
                f"redundant ratio {redundant!r} is unknown; expected one of {', '.join(REDUNDANT_RATIO_SOURCES)}."
            )
        formula = formula or IterationTimeFormula()
        t_given, r_given = explicit_iteration_seconds, explicit_recovery_seconds
        if t_given is not None and not (t_given > 0 and math.isfinite(t_given)):
            raise ValueError(
                f"iteration time {t_given!r} s is invalid; expected a positive number of seconds."
            )
        if r_given is not None and not (r_given >= 0 and math.isfinite(r_given)):
            raise ValueError(f"recovery time {r_given!r} s is invalid; expected a number of seconds ≥ 0.")
        if explicit_iteration_seconds is not None:
            t, src = float(explicit_iteration_seconds), f"given: {explicit_iteration_seconds:g} s"
        elif swarm_iteration_seconds is not None and swarm_iteration_seconds > 0:
            t, src = float(swarm_iteration_seconds), f"swarm measured: {swarm_iteration_seconds:.4g} s"
        elif formula_inputs is not None:
            inputs = dict(formula_inputs)
            fwd = inputs.pop("forward_seconds", None)
            how = "given"
            if fwd is None:
                if compute_seconds is None:
                    raise ValueError(
                        "the iteration-time formula needs T_fwd; no forward time was given and no run "
                        "measured its compute seconds."
                    )
                fwd, how = (
                    formula.forward_seconds_from_compute(compute_seconds),
                    (f"measured compute {compute_seconds:.4g} s / {formula.backward_factor:g}"),
                )
            parts = formula.components(fwd, **inputs)
            t = parts["total"]
            src = (
                f"formula (docs/paper.md §5): T_fwd {fwd:.4g} s ({how}); compute {parts['compute']:.4g} s + activations "
                f"{parts['activations']:.4g} s + data parallel {parts['data_parallel']:.4g} s = {t:.4g} s"
            )
        else:
            raise ValueError(
                "no iteration time: expected an explicit value, a swarm measurement or formula inputs."
            )
        if explicit_recovery_seconds is not None:
            r, rsrc = float(explicit_recovery_seconds), f"given: {explicit_recovery_seconds:g} s per stage"
        elif swarm_recovery_seconds is not None and swarm_recovery_seconds >= 0:
            r, rsrc = (
                float(swarm_recovery_seconds),
                f"swarm measured: {swarm_recovery_seconds:.4g} s per stage",
            )
        else:
            r = PAPER_RECOVERY_SECONDS / PAPER_ITERATION_SECONDS * t
            rsrc = (
                f"paper ratio: {PAPER_RECOVERY_SECONDS:g} s per stage at {PAPER_ITERATION_SECONDS} s per "
                f"iteration → {r:.4g} s at {t:.4g} s"
            )
        return cls(t, src, r, rsrc, compute_seconds, formula, redundant)

    def with_recovery_factor(self, factor: float) -> TimingModel:
        """This model with the recovery seconds per stage × ``factor``; T_iter and everything else unchanged.

        For the report's sensitivity to the recovery cost (paper §5.3 measured ≈30 s per stage in one testbed,
        docs/paper.md §7; checkfree only scales it): :meth:`timeline` then charges the scaled seconds.

        Raises:
            ValueError: ``factor`` is not a finite number ≥ 0.
        """
        if not (factor >= 0 and math.isfinite(factor)):
            raise ValueError(f"recovery factor {factor!r} is invalid; expected a finite number ≥ 0.")
        if factor == 1:
            return self
        return replace(
            self,
            recovery_seconds=self.recovery_seconds * factor,
            recovery_source=f"×{factor:g} of {self.recovery_seconds:.4g} s ({self.recovery_source})",
        )

    def timeline(self, costs: RunCosts) -> RunTimeline:
        """The simulated clock of one run (the redundant ratio applies to ``redundant`` runs and to runs that kept
        Bamboo replicas and measured their forward, e.g. ``ladder`` with its ``redundant`` rung)."""
        ratio, ratio_src = 1.0, ""
        if costs.strategy == "redundant" or costs.redundant_forward_seconds_per_microbatch is not None:
            measured = self.redundant_source == "measured"
            ratio, ratio_src = redundant_ratio(
                costs.redundant_forward_seconds_per_microbatch if measured else None,
                costs.mb_count,
                self.baseline_compute_seconds or costs.median_compute_seconds,
                costs.n_stages,
            )
        events = [(float(i), self.recovery_seconds, "recovery") for i, _ in costs.recoveries]
        events += [(float(i), s, "save_stall") for i, s in costs.save_stalls]
        events += [(float(i), s, "snapshot_stall") for i, s in costs.snapshot_stalls]
        return RunTimeline(self.iteration_seconds * ratio, ratio, ratio_src, sorted(events))


# ---------------------------------------------------------------------------------------------- the target
@dataclass
class Crossing:
    """Where a validation-loss curve first reaches a target."""

    iteration: float | None
    """Wall-clock iteration (fractional when interpolated between two evaluations); None = never reached."""
    interpolated: bool = False
    best_loss: float = math.inf
    best_iteration: int | None = None

    @property
    def reached(self) -> bool:
        return self.iteration is not None


def crossing_iteration(evals: Sequence[tuple[float, float]], target: float) -> Crossing:
    """First wall-clock iteration at which validation loss ≤ ``target``.

    ``evals`` are (iteration, validation loss) pairs. Between an evaluation above the target and the next one at
    or below it, the crossing is interpolated linearly (the authors' offline computation interpolates too). A
    curve that starts at or below the target crosses at its first evaluation; NaN/inf losses never reach it.
    """
    points: dict[float, float] = {}
    for it, loss in evals:
        v = _num(loss, math.nan)
        points[float(it)] = v if math.isfinite(v) else math.inf  # a later duplicate wins (a re-evaluation)
    ordered = sorted(points.items())
    best_loss, best_it = math.inf, None
    for it, loss in ordered:
        if loss < best_loss:
            best_loss, best_it = loss, int(it)
    prev: tuple[float, float] | None = None
    for it, loss in ordered:
        if loss <= target:
            if prev is None or not math.isfinite(prev[1]):
                return Crossing(it, False, best_loss, best_it)
            pi, pl = prev
            x = pi + (pl - target) / (pl - loss) * (it - pi)
            return Crossing(x, x != it, best_loss, best_it)
        prev = (it, loss)
    return Crossing(None, False, best_loss, best_it)
