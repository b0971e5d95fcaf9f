"""Rolling back (``checkpoint``): a whole stage was lost, so every serving node not at the newest checkpoint every
stage stored restores it from the storage node, and the iterations since are redone (docs/paper.md §8)."""

from __future__ import annotations

import logging

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, command, journal, record
from checkfree.swarm.supervisor.state import SwarmError

log = logging.getLogger(__name__)


class RollingBack(Phase):
    """Roll every serving node back to ``version`` (a slot the schedule keeps away copies a live replica when it
    comes back) and wait until each restored it; then the state's iteration is ``version``. ``it``, ``lost``,
    ``pending``: the iteration it interrupts, the stages lost, the crashes recovered (for :class:`Recovered`).

    Raises (from its steps):
        SwarmError: a node died, the storage node died (its checkpoints with it), or ``recovery_timeout`` passed.
    """

    name = "rolling back"
    police = False  # no eviction mid-rollback: a death here fails the run
    watch_deaths = True

    def __init__(self, version: int, it: int, lost: set[int], pending: set[int]) -> None:
        self.version, self.it, self.lost, self.pending = version, it, lost, pending

    def enter(self, ctx: Context, now: float) -> Decision:
        roster, version = ctx.state.roster, self.version
        self.targets = {s.occupant for s in roster.slots if s.serving and s.version != version}
        log.warning(
            "supervisor: a whole stage was lost; rolling %d nodes back to iteration %d",
            len(self.targets),
            version,
        )
        ctx.state.reports.clear("restored")
        self.deadline = now + ctx.state.cfg.recovery_timeout
        return self.stay([command(node, "rollback", version=version) for node in self.targets])

    def step(self, ctx: Context, turn: Turn) -> Decision:
        storage = ctx.state.roster.storage
        if turn.died or (storage is not None and storage.dead):
            self.fail()
        restored = ctx.state.reports.restored
        if not self.targets <= set(restored):
            return self.stay()
        nbytes = sum(m.get("bytes", 0) for m in restored.values())
        ctx.state.iteration = self.version
        actions = [
            record("rolled_back", self.it, self.version, self.lost, nbytes),
            journal(f"rolled back to iteration {self.version}"),
        ]
        return Decision(actions, ctx.phases.Recovered(self.pending))

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        self.fail()

    def fail(self) -> None:
        raise SwarmError(
            f"rollback to iteration {self.version} did not finish (a node or the storage node died, or it timed out)."
        )
