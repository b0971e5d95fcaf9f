"""Between two attempts: journal the last commit, bring back the slots whose down interval ended, then wait for
a returning node, recover the dead, or run the next attempt (docs/paper.md §8; checkfree.swarm.supervisor.outages).
"""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import Act, Context, Decision, Phase, die_if, journal

log = logging.getLogger(__name__)


class Between(Phase):
    """The top of the loop between attempts; decides at once. Ends the training at ``iterations`` committed (its
    validation, then the model and the shutdown). Result (driven alone): the phase it goes to."""

    name = "between attempts"
    poll_s = None

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        if state.iteration >= ctx.iterations:
            ending = end_of_training(ctx)
            return Decision(ctx.phases.joined(ctx), ending, ending)
        actions: list[Act] = []
        if state.commit_unjournaled:  # the last commit, once the state's iteration has moved on past it
            state.intent, state.commit_unjournaled = None, False
            actions += [
                journal(f"committed iteration {state.iteration - 1}"),
                die_if("committed", state.iteration - 1),
            ]
        ctx.outages.bring_back()
        actions += ctx.phases.joined(ctx)  # on_recovered for replacements that joined from the background
        if ctx.outages.stranded():
            nxt: Phase = ctx.phases.WaitingForReturns(state.iteration)
        else:
            nxt = after_returns(ctx)
        return Decision(actions, nxt, nxt)


def after_returns(ctx: Context) -> Phase:
    """Once no stage waits for a returning node: recover the dead slots, or go on."""
    roster = ctx.state.roster
    if (roster.all_serving() and not ctx.state.candidates) or ctx.outages.over():
        return proceed(ctx)
    if roster.background_only() and ctx.policy.loses_state and not kills_due(ctx):  # no pause (issue 39 pt 3)
        return ctx.phases.Background(ctx.state.iteration)
    return ctx.phases.Recovering(ctx.state.iteration)


def kills_due(ctx: Context) -> bool:
    """Whether a recovery kill (the soaks' fault injection, checkfree.swarm.supervisor.recovery_kills) awaits the
    recovery of an open crash: those losses take the recovering phase, where the kills fire."""
    crashes = (ctx.results.open_crash(slot) for slot in ctx.state.roster.slots)
    iterations = {c.iteration for c in crashes if c is not None}
    return any(not k.fired and k.iteration in iterations for k in ctx.recovery_kills.kills)


def proceed(ctx: Context) -> Phase:
    """Every slot serves (but those kept away): the next attempt, or the end when a replayed trace's window is over."""
    state = ctx.state
    if ctx.outages.over():
        return ctx.phases.ScheduleOver()
    return ctx.phases.Attempting(state.iteration)


def end_of_training(ctx: Context) -> Phase:
    """The training is over: a validation of the last weights if they were not validated, the model, the shutdown."""
    ending = ctx.phases.GatheringModel(then=ctx.phases.ShuttingDown())
    return ctx.phases.Validating(then=ending) if ctx.validation.due_at_end() else ending
