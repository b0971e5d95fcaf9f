"""Shutting down: every live node is told ``shutdown`` and sends its final statistics (at most
``SHUTDOWN_TIMEOUT_S``), the launchers are told too, and this machine's processes are waited for (those left are
SIGKILLed when the supervisor reaps them)."""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import (
    Context,
    Decision,
    Phase,
    Turn,
    act,
    broadcast,
    command,
    done,
    record,
)

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 15.0


class ShuttingDown(Phase):
    """The last phase; the drive ends with it."""

    name = "shutting down"

    def enter(self, ctx: Context, now: float) -> Decision:
        roster = ctx.state.roster
        still_away = [s.slot for s in roster.slots if s.away]
        ctx.state.reports.clear()
        self.expected = {s.occupant for s in roster.all() if not s.dead}
        self.deadline = now + SHUTDOWN_TIMEOUT_S
        return self.stay([record("away_at_end", still_away), broadcast("shutdown")])

    def step(self, ctx: Context, turn: Turn) -> Decision:
        return self.finish(ctx) if self.expected <= set(ctx.state.reports.final) else self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        return self.finish(ctx)

    def finish(self, ctx: Context) -> Decision:
        finals = ctx.state.reports.final
        missing = self.expected - set(finals)
        if missing:
            log.warning("supervisor: no final stats from nodes %s", sorted(missing))
        actions = [record("final_reports", finals)]
        actions += [command(launcher, "shutdown") for launcher in ctx.state.roster.launchers]
        return done(actions + [act("host", "wait_all", timeout=10.0)])
