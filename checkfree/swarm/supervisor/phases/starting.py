"""Starting the swarm: this machine's initial nodes (a resumed supervisor restarts only the dead ones), until every
slot serves; a node that fails to start is started again under its id, at most ``max_attempts`` times
(checkfree.swarm.supervisor.processes)."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, act


class Starting(Phase):
    """Start the initial nodes (``spawn``) and wait until every slot serves. Next: storing the initial checkpoint
    (``checkpoint``, before training started), else training begins."""

    name = "starting"
    watch_deaths = True

    def __init__(self, spawn: bool = True) -> None:
        self.spawn = spawn

    def enter(self, ctx: Context, now: float) -> Decision:
        slots = [s for s in ctx.state.roster.all() if s.local] if self.spawn else []
        return self.stay([act("processes", "spawn", slot, replacement=False) for slot in slots])

    def step(self, ctx: Context, turn: Turn) -> Decision:
        state = ctx.state
        if not state.roster.all_serving():
            return self.stay([act("processes", "replace_dead", initial=True)])
        if not state.training and state.roster.storage is not None and not state.checkpoints.holds_initial():
            return Decision([], ctx.phases.StoringInitial())
        return Decision([], ctx.phases.TrainingBegins())
