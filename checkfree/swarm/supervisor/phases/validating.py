"""Validating: the pipeline runs the validation batches forward only and the validation loss is recorded
(checkfree.swarm.supervisor.validation); a node's death or ``iteration_timeout`` gives it up (the loop's next turn
recovers the node)."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import POLL_S, Context, Decision, Phase, Turn, act, then


class Validating(Phase):
    """One validation, then ``then`` (None: the drive ends)."""

    name = "validating"
    poll_s = POLL_S
    watch_deaths = True

    def __init__(self, then: Phase | None = None) -> None:
        self.then = then

    def enter(self, ctx: Context, now: float) -> Decision:
        self.deadline = now + ctx.state.cfg.iteration_timeout
        return self.stay([act("validation", "begin")])  # sends nothing when it cannot begin (it records why)

    def step(self, ctx: Context, turn: Turn) -> Decision:
        validation = ctx.validation
        if not validation.open:  # it could not begin
            return then([], self.then)
        if turn.died:
            return then([act("validation", "give_up", "a node died")], self.then)
        if validation.complete():
            return then([act("validation", "finish")], self.then)
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        why = f"not every stage-0 node reported within {ctx.state.cfg.iteration_timeout:.0f} s"
        return then([act("validation", "give_up", why)], self.then)
