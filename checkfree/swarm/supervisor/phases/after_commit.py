"""After a commit: a validation when one is due, then the snapshots' turn (checkfree.swarm.supervisor.validation,
.model_io), then the next attempt's turn."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, act


class AfterCommit(Phase):
    """Decides at once: validate (``validated`` False and one is due), else ask for a snapshot if one is due."""

    name = "after a commit"
    poll_s = None

    def __init__(self, validated: bool = False) -> None:
        self.validated = validated

    def enter(self, ctx: Context, now: float) -> Decision:
        state = ctx.state
        if not self.validated and ctx.validation.due(state.iteration, ctx.iterations):
            return Decision([], ctx.phases.Validating(then=AfterCommit(validated=True)))
        return Decision(
            [act("model_io", "after_commit", state.iteration, state.roster.members())], ctx.phases.Between()
        )
