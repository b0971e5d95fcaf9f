"""Finishing a commit after a resume, without sockets (roll forward, checkfree.swarm.supervisor.adoption): the
members that still hold the gradients get ``commit`` again, the ones that stepped count as committed, the
iteration is recorded from the journaled intent; a member that does not step in time is killed."""

from __future__ import annotations

from checkfree.swarm.supervisor.adoption import CommitIntent, Verdict
from checkfree.swarm.supervisor.phases.base import DONE
from checkfree.swarm.supervisor.phases.finishing_commit import FinishingCommit

from helpers.phases import World


def _mid_commit(tmp_path) -> tuple[World, FinishingCommit, list[int], list[int]]:
    world = World(tmp_path)
    state = world.state
    state.iteration, state.attempt = 4, 9
    nodes = world.nodes()
    ends = {n: {"attempt": 9, "loss": 2.0, "tokens": 64} for n in world.stage0()}
    ready = {n: {"attempt": 9, "grad_norm": 1.0} for n in nodes}
    intent = CommitIntent(9, 4, state.roster.members(), ends, ready)
    stepped, pending = nodes[:2], nodes[2:]
    verdict = Verdict(
        adopt={n: {} for n in nodes}, roll_forward=True, stepped=stepped, pending=pending, attempt=9
    )
    return world, FinishingCommit(intent, verdict, {}), stepped, pending


def test_a_resume_in_the_middle_of_a_commit_rolls_it_forward(tmp_path) -> None:
    world, phase, stepped, pending = _mid_commit(tmp_path)
    world.enter(phase)
    assert [(to, c) for to, c, _ in world.link.sent] == [
        (n, "commit") for n in pending
    ]  # not to those that stepped
    world.reports("committed", pending[:-1], attempt=9, version=5)
    assert world.turn(phase).next is phase
    world.reports("committed", pending[-1:], attempt=8, version=5)  # another attempt's: not this commit's
    assert world.turn(phase).next is phase
    world.reports("committed", pending[-1:], attempt=9, version=5)
    decision = world.turn(phase)
    assert decision.next is DONE and world.state.iteration == 5
    assert [(r["iteration"], r["attempt"]) for r in world.results.rows] == [(4, 9)]


def test_a_member_that_does_not_step_in_time_is_killed_and_the_commit_recorded_without_it(tmp_path) -> None:
    world, phase, stepped, pending = _mid_commit(tmp_path)
    world.enter(phase)
    world.reports("committed", pending[:-1], attempt=9, version=5)
    decision = world.turn(phase, dt=world.cfg.iteration_timeout + 1)
    assert [a.args[0].occupant for a in decision.actions] == pending[-1:]  # only the late one
    assert decision.next is phase and phase.ends_at(world.ctx) == float("inf")
    decision = world.turn(phase)
    assert decision.next is DONE and world.results.rows[-1]["iteration"] == 4
