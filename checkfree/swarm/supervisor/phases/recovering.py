"""Recovering: every dead slot (but those the schedule keeps away) gets a replacement that rebuilds its stage by the
plan made for this loss event (checkfree.swarm.supervisor.planning), until every slot serves again; a node that
dies meanwhile is a new loss event, planned before any replacement of it starts. Under ``checkpoint`` a whole-stage
loss then rolls every node back (checkfree.swarm.supervisor.phases.rolling_back)."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import (
    Act,
    Context,
    Decision,
    Phase,
    Turn,
    act,
    die_if,
    kill,
    record,
)
from checkfree.swarm.supervisor.state import SupervisorState, SwarmError


def check_rollback(state: SupervisorState, rollback: bool, lost: set[int]) -> None:
    """Raise SwarmError once a rollback is needed and no checkpoint every stage stored is left."""
    if rollback and not state.checkpoints.has_complete():
        cause = state.checkpoints.missing_cause()
        raise SwarmError(f"stages {sorted(lost)} were lost and cannot be rolled back: {cause}.")


class Recovering(Phase):
    """Recover the dead slots before the attempt at iteration ``it``.

    Raises (from its steps):
        SwarmError: a lost stage cannot be rolled back (no complete checkpoint is left), or the setting cannot
            recover a lost stage (the planner's).
    """

    name = "recovering"
    watch_deaths = True

    def __init__(self, it: int) -> None:
        self.it = it

    def enter(self, ctx: Context, now: float) -> Decision:
        state, roster = ctx.state, ctx.state.roster
        self.lost = roster.lost_stages()
        self.rollback = bool(self.lost) and ctx.policy.rollback_on_stage_loss
        open_crashes = (ctx.results.open_crash(slot) for slot in roster.slots)
        self.pending = {c.node for c in open_crashes if c is not None}
        check_rollback(state, self.rollback, self.lost)
        return self.stay([record("stages_lost", self.lost), act("planner", "plan_event", self.lost)])

    def step(self, ctx: Context, turn: Turn) -> Decision:
        state, roster, policy = ctx.state, ctx.state.roster, ctx.policy
        check_rollback(state, self.rollback, self.lost)  # the storage node died: its checkpoints went with it
        actions: list[Act] = [act("planner", "answer_replans")]
        kills = [kill(victim, why) for victim, why in ctx.recovery_kills.tick(state.begun_iteration)]
        if turn.died:  # a new loss event: planned before any replacement of it starts
            new_loss = roster.lost_stages()
            actions.append(act("planner", "plan_event", new_loss))
            if new_loss and policy.rollback_on_stage_loss and not self.rollback:
                self.rollback, self.lost = True, new_loss  # a stage lost while a partial loss recovers
                check_rollback(state, self.rollback, self.lost)
        if kills:  # their deaths are noticed (and planned) at the next turn, before their replacements start
            return self.stay(actions + kills)
        actions.append(act("processes", "replace_dead"))
        if any(s.address is not None and not s.serving and not s.dead for s in roster.slots):
            actions.append(die_if("recovering", self.it, after_s=0.2))  # the resume tests: mid-recovery
        if roster.all_serving():
            return self._recovered(ctx, actions)
        return self.stay(actions)

    def _recovered(self, ctx: Context, actions: list[Act]) -> Decision:
        if self.rollback:
            version = ctx.state.checkpoints.newest_complete()
            return Decision(actions, ctx.phases.RollingBack(version, self.it, self.lost, self.pending))
        return Decision(actions, Recovered(self.pending), ctx.state.iteration)


class Recovered(Phase):
    """Every slot serves again: the slots' start counts begin afresh (the storage node's too: its restarts are not
    one failing start), ``on_recovered`` is called with the crashes recovered (``pending``: their nodes), and the
    next attempt runs. Result (driven alone): the iteration to run."""

    name = "recovered"
    poll_s = None

    def __init__(self, pending: set[int]) -> None:
        self.pending = pending

    def enter(self, ctx: Context, now: float) -> Decision:
        for slot in ctx.state.roster.all():
            slot.starts_forgiven()
        return Decision(
            [act("supervisor", "recovered", self.pending)], ctx.phases.proceed(ctx), ctx.state.iteration
        )
