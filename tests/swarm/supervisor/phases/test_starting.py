"""Starting the swarm, without processes: every local slot's node started, dead starts retried under their ids,
then the initial checkpoint (``checkpoint``) or training."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.starting import Starting
from checkfree.swarm.supervisor.phases.storing_initial import StoringInitial
from checkfree.swarm.supervisor.phases.training import TrainingBegins

from helpers.phases import World


def test_every_local_node_starts_and_the_failed_ones_start_again_until_every_slot_serves(tmp_path) -> None:
    world = World(tmp_path, "checkpoint")
    roster = world.state.roster
    for slot in roster.all():
        slot.serving = False
    phase = Starting()
    decision = world.enter(phase)
    assert [a.args[0].slot for a in decision.actions] == [s.slot for s in roster.all()]
    assert all(a.kwargs == {"replacement": False} for a in decision.actions)
    decision = world.turn(phase)
    assert [(a.op, a.kwargs) for a in decision.actions] == [("replace_dead", {"initial": True})]
    for slot in roster.all():
        slot.serving = True
    assert isinstance(world.turn(phase).next, StoringInitial)  # the storage node holds no version 0 yet
    world.state.checkpoints.stored = {s: {0} for s in range(world.cfg.n_stages + 1)}
    assert isinstance(world.turn(phase).next, TrainingBegins)
    assert world.enter(Starting(spawn=False)).actions == []  # a resumed supervisor starts only the dead
