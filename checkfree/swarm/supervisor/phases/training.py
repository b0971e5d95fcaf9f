"""Training begins (the results' clock starts; a validation at iteration 0 when one is due, as the simulator), and
training ends early when a replayed trace's window is over (checkfree.swarm.supervisor.outages)."""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import Act, Context, Decision, Phase, record

log = logging.getLogger(__name__)


class TrainingBegins(Phase):
    """Every slot serves (and the storage node holds version 0): start the clock, validate if due, then train."""

    name = "training begins"
    poll_s = None

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        actions: list[Act] = []
        if not state.training:
            actions.append(record("start"))
            state.training = True
        if ctx.validation.due(state.iteration, ctx.iterations):
            return Decision(actions, ctx.phases.Validating(then=ctx.phases.Between()))
        return Decision(actions, ctx.phases.Between())


class ScheduleOver(Phase):
    """A replayed trace's window is over before the target: the run ends (its validation, model, shutdown)."""

    name = "schedule over"
    poll_s = None

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        log.warning(
            "supervisor: the schedule's %d iterations are over after %d committed iterations; the run ends",
            state.schedule_clock,
            state.iteration,
        )
        return Decision([record("ended_by_schedule")], ctx.phases.end_of_training(ctx))
