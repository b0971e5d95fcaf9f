"""The resumed phase without sockets: the outage recorded, the resume journaled, then the run goes on in the phase
the journal was in."""

from __future__ import annotations

from checkfree.swarm.supervisor.adoption import Verdict
from checkfree.swarm.supervisor.phases.after_commit import AfterCommit
from checkfree.swarm.supervisor.phases.resumed import Resumed
from checkfree.swarm.supervisor.phases.starting import Starting
from checkfree.swarm.supervisor.phases.training import TrainingBegins

from helpers.phases import World


def test_the_run_goes_on_in_the_phase_the_journal_was_in(tmp_path) -> None:
    world = World(tmp_path)
    state = world.state
    state.resumed_from, state.resumes, state.iteration = {"written": 0.0}, 2, 4
    verdict = Verdict(adopt={0: {}}, replace={1: "gone"})
    state.training = True
    decision = world.enter(Resumed(verdict, {}, 1.0, 4, [], 4))  # a commit rolled forward
    assert isinstance(decision.next, AfterCommit)
    outage = world.results.outages[-1]
    assert (outage["resume"], outage["rolled_forward"], outage["replaced"]) == (2, 4, {"1": "gone"})
    assert decision.actions[2].args == ("resume 2",) and world.link.commands() == ["peers"]
    assert isinstance(world.enter(Resumed(verdict, {}, 1.0, 4, [4], None)).next, TrainingBegins)
    state.training = False  # the supervisor died before training started
    nxt = world.enter(Resumed(verdict, {}, 1.0, 0, [], None)).next
    assert isinstance(nxt, Starting) and not nxt.spawn
