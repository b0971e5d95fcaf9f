"""The run results checkfree reads back: throughput.json (a swarm run, as ``swarm table`` and the report read it)
and summary.json (a simulator run, as the report reads it).

Both files are checkfree's own, but they grow keys as the code does (an older or newer file has other keys), so
the schemas check the keys their readers use, with their types, and let other keys pass. A number may be NaN or
infinite here: a diverging run writes them (checkfree.jsonio), and the readers print them as such.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Count = Annotated[StrictInt, Field(ge=0, description="an integer ≥ 0")]
Seconds = Annotated[StrictFloat | None, Field(description="a number or null")]
LossPoint = Annotated[list[StrictFloat | None], Field(min_length=2, max_length=2)]
"""One point of ``loss_curve``: [iteration, loss] (the loss may be null)."""


class FinalEval(BaseModel):
    """The last validation of a run (``final_eval``)."""

    model_config = ConfigDict(strict=True, extra="allow")
    val_loss: StrictFloat | None = None
    perplexity: StrictFloat | None = None
    iteration: StrictInt | None = None


class ScheduleInfo(BaseModel):
    """The schedule a swarm run replayed (``schedule``), as far as the table reads it."""

    model_config = ConfigDict(strict=True, extra="allow")
    format: StrictStr | None = None
    path: StrictStr | None = None
    iterations: StrictInt | None = None
    source: dict[str, Any] | None = None


class FailSlow(BaseModel):
    """A node named fail-slow (``fail_slow``, checkfree.swarm.supervisor.speeds)."""

    model_config = ConfigDict(strict=True, extra="allow")
    node: StrictInt
    stage: StrictInt
    factor: StrictFloat
    since: StrictInt


class RoutingPlanRow(BaseModel):
    """An iteration's routing plan (checkfree.swarm.routing ``RoutingPlan.to_json``)."""

    model_config = ConfigDict(strict=True, extra="allow")
    shares: dict[StrictStr, dict[StrictStr, Count]]
    bound_s: StrictFloat
    plan_s: StrictFloat
    fixed_s: StrictFloat


class IterationRow(BaseModel):
    """An iteration's row (``iterations``), as far as the table reads it (older files lack these keys)."""

    model_config = ConfigDict(strict=True, extra="allow")
    iteration: StrictInt | None = None
    resent_microbatches: Count | None = None
    rerouted: Count | None = None
    routing_plan: RoutingPlanRow | None = None


class ThroughputRow(BaseModel):
    """The keys of a swarm run's throughput.json that ``swarm table`` and the report read (the table also needs
    each of checkfree.swarm.cli.TABLE_KEYS present; an older file may lack some, which the report allows)."""

    model_config = ConfigDict(strict=True, extra="allow")
    setting: StrictStr | None = None
    iterations_completed: Count | None = None
    iterations_executed: Count | None = None
    crashes_count: Count | None = None
    recovered_count: Count | None = None
    mean_iteration_s: Seconds | None = None
    mean_iteration_s_without_crashes: Seconds | None = None
    mean_crash_to_serving_s: Seconds | None = None
    tokens_per_s: Seconds | None = None
    loss_curve: list[LossPoint] | None = None
    final_eval: FinalEval | None = None
    schedule: ScheduleInfo | None = None
    replica_shortage: dict[str, dict[str, StrictFloat]] | None = None
    aborted_attempts: Count | None = None
    useful_work_fraction: StrictFloat | None = None
    fail_slow: list[FailSlow] | None = None
    iterations: list[IterationRow] | Count | None = None


class Summary(BaseModel):
    """The keys of a simulator run's summary.json that the report reads (checkfree.report.runs and its users)."""

    model_config = ConfigDict(strict=True, extra="allow")
    status: StrictStr | None = None
    cause: StrictStr | None = None
    strategy: StrictStr | None = None
    config: StrictStr | None = None
    swaps: StrictBool | None = None
    iterations: Count | None = None
    failures: Count | None = None
    recoveries: Count | None = None
    fallbacks: Count | None = None
    world_size: Annotated[StrictInt, Field(ge=1)] | None = None
    failure_rate_per_hour: StrictFloat | None = None
    failure_probability: StrictFloat | None = None
    final_eval: FinalEval | None = None
    strategy_stats: dict[str, Any] | None = None
