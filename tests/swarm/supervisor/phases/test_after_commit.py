"""After a commit, without sockets: the validation when one is due, then the snapshots' turn."""

from __future__ import annotations

from checkfree.swarm.supervisor.phases.after_commit import AfterCommit
from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.phases.validating import Validating

from helpers.phases import World


def test_a_due_validation_comes_first_then_the_snapshots_turn(tmp_path) -> None:
    world = World(tmp_path, iterations=200)
    world.state.iteration, world.state.commits = 50, 50  # eval_interval 50
    decision = world.enter(AfterCommit())
    assert decision.actions == [] and isinstance(decision.next, Validating)
    assert isinstance(decision.next.then, AfterCommit) and decision.next.then.validated
    decision = world.enter(decision.next.then)
    assert [(a.op, a.args[0]) for a in decision.actions] == [("after_commit", 50)]
    assert isinstance(decision.next, Between)
    world.state.iteration, world.state.commits = 51, 51
    assert isinstance(world.enter(AfterCommit()).next, Between)
