"""Waiting for a returning node: a stage whose every replica the schedule keeps away is lost, so the swarm waits,
one schedule iteration per ``reference_s`` seconds (the median committed iteration so far), firing the crashes and
returns due meanwhile, until every lost stage has a slot coming back, or the schedule is over
(checkfree.swarm.supervisor.outages); the returning node then recovers the stage by the setting's rule."""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import (
    RECOVERY_POLL_S,
    Act,
    Context,
    Decision,
    Phase,
    Turn,
    journal,
    record,
)

log = logging.getLogger(__name__)


class WaitingForReturns(Phase):
    """Wait before training iteration ``it`` while a stage is stranded. Each schedule iteration waited is one
    deadline of this phase. Result (driven alone): (stage → schedule iterations it waited, seconds waited, the
    schedule clock when the wait began)."""

    name = "waiting for returns"
    watch_deaths = True

    def __init__(self, it: int) -> None:
        self.it = it
        self.waited: dict[int, int] = {}

    def poll(self, now: float) -> float | None:
        return min(RECOVERY_POLL_S, max(0.0, self.deadline - now))

    def enter(self, ctx: Context, now: float) -> Decision:
        self.reference = ctx.results.reference_iteration_s()
        self.start_clock, self.t0 = ctx.state.schedule_clock, now
        log.warning(
            "supervisor: stages %s lost with every replica down (schedule iteration %d); waiting for a node to "
            "come back, %.3f s per schedule iteration",
            ctx.outages.stranded(),
            ctx.state.schedule_clock,
            self.reference,
        )
        return self._wait_or_end(ctx, now, [])

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        """One schedule iteration went by: the crashes due in it fire, the slots due back come back."""
        outages = ctx.outages
        crashes = outages.advance()  # down intervals go by the clock, not a training iteration
        actions: list[Act] = []
        if crashes:
            actions.append(journal(f"scheduled crashes at schedule iteration {ctx.state.schedule_clock}"))
        for slot, down in crashes:
            actions += ctx.phases.crash_actions(ctx, slot, self.it, down)
        outages.bring_back()
        return self._wait_or_end(ctx, turn.now, actions)

    def _wait_or_end(self, ctx: Context, now: float, actions: list[Act]) -> Decision:
        stranded = ctx.outages.stranded()
        if stranded and not ctx.outages.over():
            for stage in stranded:
                self.waited[stage] = self.waited.get(stage, 0) + 1
            self.deadline = now + self.reference
            return self.stay(actions)
        seconds, clock = now - self.t0, ctx.state.schedule_clock
        actions.append(
            record("waited", self.it, self.waited, self.reference, seconds, self.start_clock, clock)
        )
        log.warning(
            "supervisor: waited %.1f s (schedule iterations %d → %d) for stages %s",
            seconds,
            self.start_clock,
            clock,
            sorted(self.waited),
        )
        return Decision(actions, ctx.phases.after_returns(ctx), (self.waited, seconds, self.start_clock))
