"""Resumed: the peers learn the new table, the outage is recorded (throughput.json ``outages``), the resume is
journaled; then the run goes on from the journaled state, in the phase it was in: after the commit just finished,
starting the nodes (a supervisor that died before training started), or between attempts."""

from __future__ import annotations

import logging
from typing import Any

from checkfree.swarm.supervisor.adoption import Verdict
from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, broadcast, journal, record

log = logging.getLogger(__name__)


class Resumed(Phase):
    """``iteration``: the journal's; ``redone``: the iteration redone (an attempt was in flight); ``rolled``: the
    iteration whose commit was finished (None: none)."""

    name = "resumed"
    poll_s = None

    def __init__(
        self,
        verdict: Verdict,
        claims: dict[int, dict[str, Any]],
        t_resumed: float,
        iteration: int,
        redone: list[int],
        rolled: int | None,
    ) -> None:
        self.verdict, self.claims, self.t_resumed = verdict, claims, t_resumed
        self.iteration, self.redone, self.rolled = iteration, redone, rolled

    def enter(self, ctx: Context, now: float) -> Decision:
        state, verdict, rolled = ctx.state, self.verdict, self.rolled
        data = state.resumed_from
        assert data is not None
        lost = [c.get("last_control_wall", 0.0) for c in self.claims.values()] + [float(data["written"])]
        outage = record(
            "resumed",
            state.resumes,
            max(lost),
            self.t_resumed,
            self.iteration,
            self.redone,
            rolled,
            sorted(verdict.adopt),
            dict(verdict.replace),
            state.stale_after_resume,
        )
        log.warning(
            "supervisor: resumed: %d nodes adopted, %d replaced%s%s",
            len(verdict.adopt),
            len(verdict.replace),
            f", the commit of iteration {rolled} finished" if rolled is not None else "",
            f", iteration {self.redone[0]} is redone" if self.redone else "",
        )
        actions = [
            broadcast("peers", **state.roster.peers_fields()),
            outage,
            journal(f"resume {state.resumes}"),
        ]
        if rolled is not None:
            return Decision(actions, ctx.phases.AfterCommit())
        if not state.training:
            return Decision(actions, ctx.phases.Starting(spawn=False))
        return Decision(actions, ctx.phases.TrainingBegins())
