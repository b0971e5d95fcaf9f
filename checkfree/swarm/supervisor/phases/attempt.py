"""One attempt at one training iteration (checkfree.swarm.supervisor.attempts):

    begin → ITERATION_END from every pipeline → sync → ready from every node → commit intent journaled → commit
    → committed from every live node

A death in the forward phase that leaves every stage a serving member (a dead stage-0 node's pipeline is taken
over by another) re-routes it (``reroute``; issue 39 point 1) and the attempt goes on; any other death before ``commit`` aborts it (the
iteration is redone after recovery); the dead slots are recovered after the commit either way. A stall, or ``iteration_timeout``
passed, retries it (at most ``max_attempts`` times per iteration: SwarmError). The scheduled crashes of the attempt
fire ``crash_point`` × the last iteration's time after ``begin``, or at the latest when the forward phase ends.
The commit's intent is journaled before its broadcast (checkfree.swarm.supervisor.adoption), and a stop signal
that lands once the commit went out waits for the ``committed`` reports (:class:`~checkfree.swarm.supervisor.
phases.commit_in_flight.CommitInFlight`).
"""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.failpoints import armed
from checkfree.swarm.supervisor.phases.base import (
    Act,
    Context,
    Decision,
    Phase,
    Turn,
    act,
    broadcast,
    die_if,
    journal,
    kill,
    record,
)
from checkfree.swarm.supervisor.state import CommitIntent, Slot

log = logging.getLogger(__name__)


def crash_actions(ctx: Context, slot: Slot, it: int, down: int) -> list[Act]:
    """The scheduled crash of ``slot`` at schedule iteration ``down`` (during training iteration ``it``): kill its
    node and keep the slot away as long as the schedule says (decided now: the slot's ``away``); ``no_failure``
    logs it and kills nobody."""
    if not ctx.policy.loses_state:
        log.info("supervisor: scheduled crash of slot %d at iteration %d skipped (no_failure)", slot.slot, it)
        return [record("skipped_crash", slot, it)]
    actions = []
    if not slot.dead:  # else its node is gone already (it came back and was not replaced yet): it stays away
        actions = [record("scheduled_kill", slot, it), kill(slot, f"scheduled crash at iteration {it}")]
    if ctx.outages.keep_away(slot, down):
        actions.append(record("kept_away", slot))
    return actions


def fire(ctx: Context, it: int) -> list[Act]:
    """The scheduled crashes of the attempt in progress fire now (journaled as fired first: a resumed supervisor
    never fires one twice)."""
    current = ctx.state.current
    assert current is not None
    slots = ctx.state.roster.slots
    fired = [(slots[n], ctx.outages.fire(slots[n], it)) for n in current.due]
    actions = [journal(f"scheduled crashes at iteration {it}")] if fired else []
    for slot, down in fired:
        actions += crash_actions(ctx, slot, it, down)
    return actions


class Attempting(Phase):
    """One attempt at iteration ``it``. Result (driven alone): True when committed, False when aborted."""

    name = "attempt"
    poll_s = 0.005
    watch_deaths = True

    def __init__(self, it: int) -> None:
        self.it = it

    def ends_at(self, ctx: Context) -> float:
        """The attempt's deadline (``iteration_timeout`` after ``begin``)."""
        current = ctx.state.current
        return current.deadline if current is not None else float("inf")

    def holds_signals(self, ctx: Context) -> bool:
        """In the commit phase a stop signal waits for the message in hand: a ``committed`` report received but
        not yet taken would leave the commit unrecorded and the model a step ahead."""
        current = ctx.state.current
        return current is not None and current.phase == "commit"

    def enter(self, ctx: Context, now: float) -> Decision:
        due = [slot.slot for slot in ctx.outages.due(self.it)]
        return self.stay(
            [
                act("attempts", "begin", self.it, due, ctx.results.last_wall_s()),
                die_if("begun", self.it, after_s=0.3),
            ]
        )

    def step(self, ctx: Context, turn: Turn) -> Decision:
        state, it = ctx.state, self.it
        current = state.current
        assert current is not None
        actions = fire(ctx, it) if ctx.attempts.crash_due(turn.now) else []
        if turn.died and current.phase != "commit":
            dead = ctx.attempts.dead_members()
            if not dead:  # a replacement recovering in the background: restarted at the next boundary
                return self.stay(actions)
            if ctx.attempts.can_reroute(dead):  # every stage still serves: the attempt goes on
                return self.stay(actions + [act("attempts", "reroute", dead), record("rerouted", it)])
            return self._over(
                ctx, actions + [act("attempts", "abort", "a node died"), record("aborted", it)], False
            )
        if actions:
            return self.stay(actions)
        step = ctx.attempts.advance()
        if step is None:
            return self.stay()
        if step.kind == "fire":
            return self.stay(fire(ctx, it))
        if step.kind == "sync":
            return self.stay([broadcast("sync", attempt=current.number)])
        if step.kind == "commit":  # journaled before any node can step
            assert step.ends is not None and step.ready is not None
            state.intent = CommitIntent(current.number, it, current.members, step.ends, step.ready)
            actions = [journal(f"commit of iteration {it}")]
            if armed("commit-partial", it):  # the resume tests: one node steps, then the supervisor dies
                actions += [
                    act("attempts", "commit", to=current.nodes()[:1]),
                    die_if("commit-partial", it, 1.0),
                ]
            # every node gets the commit, or none (a stop signal waits for it)
            return self.stay(actions + [act("supervisor", "commit_held")])
        if step.kind == "committed":
            return self._over(ctx, [act("supervisor", "committed", it, step.ends, step.ready)], True)
        return self._retry(ctx, step.why)

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        return self._retry(ctx, f"no commit within {ctx.state.cfg.iteration_timeout:.0f} s")

    def _retry(self, ctx: Context, why: str) -> Decision:
        """Abort and retry (the executor's ``retry`` raises SwarmError at ``max_attempts``)."""
        return self._over(ctx, [act("attempts", "retry", why), record("aborted", self.it)], False)

    def _over(self, ctx: Context, actions: list[Act], committed: bool) -> Decision:
        if committed:
            return Decision(actions, ctx.phases.AfterCommit(), True)
        return Decision(actions, ctx.phases.Between(), False)

    def interrupted(self, ctx: Context) -> Phase | None:
        """A stop signal: once the commit went out the nodes step whatever the supervisor does, so the commit is
        waited for and recorded (checkfree.swarm.supervisor.phases.commit_in_flight)."""
        current = ctx.state.current
        if current is not None and current.phase == "commit":
            return ctx.phases.CommitInFlight(self.it)
        return None

    def abandon(self, ctx: Context) -> None:
        if ctx.state.current is not None:
            ctx.state.current.phase = "over"  # later reports of this attempt are stale
