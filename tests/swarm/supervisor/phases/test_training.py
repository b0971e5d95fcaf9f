"""Training begins, without sockets: the results' clock starts once, a validation at iteration 0 when due."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.phases.training import TrainingBegins
from checkfree.swarm.supervisor.phases.validating import Validating

from helpers.phases import World


def test_training_begins_once_with_a_validation_at_iteration_0(tmp_path) -> None:
    world = World(tmp_path)
    decision = world.enter(TrainingBegins())
    assert [(a.part, a.op) for a in decision.actions] == [("results", "start")] and world.state.training
    assert isinstance(decision.next, Validating) and isinstance(decision.next.then, Between)
    world.ctx.validation.commits = world.state.commits  # validated at these commits
    decision = world.enter(TrainingBegins())
    assert decision.actions == [] and isinstance(decision.next, Between)  # a resumed run: the clock runs on
