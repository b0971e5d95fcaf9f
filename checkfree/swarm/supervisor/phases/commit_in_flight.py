"""A stop signal (Ctrl-C, SIGTERM) landed after the commit of an iteration went out: the nodes step anyway, so the
supervisor waits (at most ``request_timeout``) for their ``committed`` reports and records the iteration; the model
kept at the end and throughput.json's committed iterations are then the same. A node that does not report in time
leaves it unrecorded (the model's gather then says the stages hold different iterations)."""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import POLL_S, Context, Decision, Phase, Turn, act, done

log = logging.getLogger(__name__)


class CommitInFlight(Phase):
    """Wait for the ``committed`` reports of the commit of iteration ``it``, then record it; the drive ends."""

    name = "commit in flight"
    poll_s = POLL_S

    def __init__(self, it: int) -> None:
        self.it = it

    def enter(self, ctx: Context, now: float) -> Decision:
        rows = ctx.results.rows
        if rows and rows[-1]["iteration"] == self.it:  # recorded already
            return done()
        self.deadline = now + ctx.state.cfg.request_timeout
        return self.stay()

    def step(self, ctx: Context, turn: Turn) -> Decision:
        step = ctx.attempts.advance()
        if step is not None and step.kind == "committed":
            record = act("supervisor", "committed", self.it, step.ends, step.ready)
            return done([record, act("supervisor", "forget_intent")])
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        log.warning(
            "supervisor: the commit of iteration %d was not confirmed by every node; not recorded", self.it
        )
        return done()
