"""Storing the initial checkpoint, without sockets: one replica per stage sends version 0; the storage node must
store it within recovery_timeout."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.phases.storing_initial import StoringInitial
from checkfree.swarm.supervisor.phases.training import TrainingBegins
from checkfree.swarm.supervisor.state import SwarmError

from helpers.phases import World


def test_version_0_is_stored_before_training_begins_or_the_run_stops(tmp_path) -> None:
    world = World(tmp_path, "checkpoint")
    phase = StoringInitial()
    world.enter(phase)
    assert world.link.sent == [("*", "checkpoint", {"checkpoint_senders": [0, 1, 2, 3, 4]})]
    assert world.turn(phase).next is phase
    world.state.checkpoints.stored = {s: {0} for s in range(world.cfg.n_stages + 1)}
    assert isinstance(world.turn(phase).next, TrainingBegins)
    phase = StoringInitial()
    world.state.checkpoints.stored = {}
    world.enter(phase)
    with pytest.raises(SwarmError, match="did not store the initial checkpoint in time"):
        world.turn(phase, dt=world.cfg.recovery_timeout + 1)
