"""Storing the initial checkpoint (``checkpoint``): every stage stores version 0 before training starts."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, broadcast
from checkfree.swarm.supervisor.state import Roster, SwarmError


def checkpoint_senders(roster: Roster) -> list[int]:
    """One serving replica per stage: the nodes that send their stage to the storage node (``checkpoint``)."""
    return [ids[0] for ids in roster.members().values() if ids]


class StoringInitial(Phase):
    """One serving replica per stage sends its stage to the storage node, within ``recovery_timeout``.

    Raises (from :meth:`expired`):
        SwarmError: the storage node did not store it in time.
    """

    name = "storing the initial checkpoint"

    def enter(self, ctx: Context, now: float) -> Decision:
        self.deadline = now + ctx.state.cfg.recovery_timeout
        return self.stay([broadcast("checkpoint", checkpoint_senders=checkpoint_senders(ctx.state.roster))])

    def step(self, ctx: Context, turn: Turn) -> Decision:
        if ctx.state.checkpoints.holds_initial():
            return Decision([], ctx.phases.TrainingBegins())
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        raise SwarmError("the storage node did not store the initial checkpoint in time.")
