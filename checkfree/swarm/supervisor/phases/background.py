"""Recovery in the background (issue 39 point 3): every slot that does not serve belongs to a stage that still
has a serving replica, so the swarm does not pause. Its replacement is started now (a copy of a serving replica,
weights and Adam state, the ``replica`` rule; checkfree.swarm.supervisor.planning) and catches up with the
commits made since its copy (checkfree.swarm.node.catch_up) while the others train; it joins at an attempt
boundary once it reports the swarm's version (checkfree.swarm.supervisor.inbox). A replacement that dies while it
recovers is a new death of such a slot: started again at the next boundary.
"""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import Act, Context, Decision, Phase, Turn, act, die_if

log = logging.getLogger(__name__)

JOIN_WAIT_S = 1.0
"""Seconds the boundary after a commit waits at most for a replacement that was current before that commit to
report again (it fetches that one update; without the wait its report would always land in the next attempt)."""


class Background(Phase):
    """Start the replacements of the dead slots (planned as one loss event with no stage lost), answer their
    replans, then go on: to :class:`Joining` when a replacement is one commit from joining, else to the attempt.
    Decides at once."""

    name = "recovering in the background"
    poll_s = None

    def __init__(self, it: int) -> None:
        self.it = it

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        actions: list[Act] = [act("planner", "answer_replans"), *joined(ctx)]
        if any(s.dead and not s.away for s in state.roster.slots):
            actions += [act("planner", "plan_event", set()), act("processes", "replace_dead")]
        if any(s.address is not None and not s.serving and not s.dead for s in state.roster.slots):
            actions.append(die_if("recovering", self.it, after_s=0.2))  # the resume tests: mid-recovery
        nxt: Phase = Joining(self.it) if joining(ctx) else ctx.phases.proceed(ctx)
        return Decision(actions, nxt, nxt)


def joined(ctx: Context) -> list[Act]:
    """``on_recovered`` for the crashes whose replacement joined from the background since the last call (the
    pausing recovery calls it once every slot serves: phases.recovering ``Recovered``)."""
    state = ctx.state
    nodes = {
        c.node
        for c in ctx.results.crashes
        if c.recovery is not None and "background_s" in c.recovery.extra and c.node not in state.joined
    }
    if not nodes:
        return []
    state.joined |= nodes
    return [act("supervisor", "recovered", nodes)]


def joining(ctx: Context) -> list[int]:
    """The replacements that reported ``serving`` at the version before the last commit (or later) and do not
    serve yet: each joins once it reports again at the swarm's version."""
    state = ctx.state
    by_node = state.roster.by_node
    out = []
    for node, version in sorted(state.candidates.items()):
        slot = by_node.get(node)
        if slot is None or slot.occupant != node or slot.dead or slot.serving:
            state.candidates.pop(node)
            continue
        if version >= state.iteration - 1:
            out.append(node)
    return out


class Joining(Phase):
    """Wait at most :data:`JOIN_WAIT_S` for the replacements one update from joining (:func:`joining`) to report
    the swarm's version; then the attempt at iteration ``it`` (those not in yet join at a later boundary)."""

    name = "joining"
    watch_deaths = True

    def __init__(self, it: int) -> None:
        self.it = it

    def enter(self, ctx: Context, now: float) -> Decision:
        self.deadline = now + JOIN_WAIT_S
        return self.stay()

    def step(self, ctx: Context, turn: Turn) -> Decision:
        if turn.died:
            return Decision(joined(ctx), ctx.phases.Between())
        if not joining(ctx):
            return Decision(joined(ctx), ctx.phases.proceed(ctx))
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        log.info("supervisor: replacements %s not current yet; they join at a later boundary", joining(ctx))
        return Decision(joined(ctx), ctx.phases.proceed(ctx))
