"""Finishing the commit a dead supervisor began (checkfree.swarm.supervisor.adoption, roll forward): ``commit`` again
to the members that still hold its gradients (each steps once); the ones that stepped count as committed; the
iteration is recorded from the journaled intent. A member that does not step within ``iteration_timeout`` is
killed (its slot is recovered by the loop)."""

from __future__ import annotations

import logging
from typing import Any

from checkfree.swarm.supervisor.adoption import CommitIntent, Verdict
from checkfree.swarm.supervisor.phases.base import (
    POLL_S,
    Act,
    Context,
    Decision,
    Phase,
    Turn,
    act,
    kill,
    then,
)
from checkfree.swarm.supervisor.state import Attempt

log = logging.getLogger(__name__)


class FinishingCommit(Phase):
    """Finish the commit of ``intent`` (``verdict``: who stepped, who steps now); then ``then``."""

    name = "finishing a commit"
    poll_s = POLL_S
    police = False
    watch_deaths = True

    def __init__(
        self,
        intent: CommitIntent,
        verdict: Verdict,
        claims: dict[int, dict[str, Any]],
        then: Phase | None = None,
    ) -> None:
        self.intent, self.verdict, self.claims, self.then = intent, verdict, claims, then

    def ends_at(self, ctx: Context) -> float:
        current = ctx.state.current
        return current.deadline if current is not None else float("inf")

    def enter(self, ctx: Context, now: float) -> Decision:
        intent, verdict = self.intent, self.verdict
        deadline = now + ctx.state.cfg.iteration_timeout
        current = Attempt(intent.attempt, intent.iteration, intent.members, now, deadline=deadline)
        current.reported["committed"] = set(verdict.stepped)
        ctx.state.current = current
        log.warning(
            "supervisor: finishing the commit of iteration %d (attempt %d): %d nodes stepped, %d step now",
            intent.iteration,
            intent.attempt,
            len(verdict.stepped),
            len(verdict.pending),
        )
        return self.stay([act("attempts", "commit", to=verdict.pending)])

    def committed(self, ctx: Context) -> set[int]:
        """The members that stepped: before the resume, or reported ``committed`` since."""
        reports = ctx.state.reports.committed
        return set(self.verdict.stepped) | {
            n for n, m in reports.items() if m.get("attempt") == self.intent.attempt
        }

    def step(self, ctx: Context, turn: Turn) -> Decision:
        state, intent = ctx.state, self.intent
        current = state.current
        assert current is not None
        alive = {n for n in current.nodes() if not state.roster.by_node[n].dead}
        if not alive <= self.committed(ctx):
            return self.stay()
        rows = ctx.results.rows
        actions: list[Act]
        if rows and (rows[-1]["iteration"], rows[-1]["attempt"]) == (intent.iteration, intent.attempt):
            # recorded already: the journal was written after the commit's record
            actions = [act("attempts", "committed")]
            state.iteration, state.commit_unjournaled = intent.iteration + 1, True
        else:
            actions = [act("supervisor", "committed", intent.iteration, intent.ends, intent.ready)]
        return then(actions, self.then)

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        state = ctx.state
        current = state.current
        assert current is not None
        actions = []
        for node in sorted(set(current.nodes()) - self.committed(ctx)):  # past iteration_timeout
            slot = state.roster.by_node[node]
            if slot.occupant == node and not slot.dead:
                actions.append(
                    kill(slot, f"resume: did not step the commit of attempt {self.intent.attempt}")
                )
        current.deadline = float("inf")
        return self.stay(actions)
