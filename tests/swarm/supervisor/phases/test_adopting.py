"""Adopting after a resume, without sockets: the answers judged against the journal (checkfree.swarm.supervisor.
adoption), the verdict carried out, then the commit in flight finished (roll forward) or the attempt aborted."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.adoption import CommitIntent, ResumeImpossible
from checkfree.swarm.supervisor.phases.adopting import Adopted, Adopting
from checkfree.swarm.supervisor.phases.finishing_commit import FinishingCommit
from checkfree.swarm.supervisor.phases.resumed import Resumed

from helpers.phases import World


def _claim(world: World, node: int, version: int, attempt: int, pending: int | None = None) -> dict:
    stage = world.state.roster.by_node[node].stage
    return {"stage": stage, "serving": True, "version": version, "attempt": attempt, "pending": pending}


def _resumed_world(tmp_path) -> World:
    world = World(tmp_path)
    world.state.iteration, world.state.attempt = 4, 9
    world.state.resumed_from, world.state.resumes = {"written": 0.0, "processes": {}}, 1
    return world


def test_a_commit_some_members_stepped_is_rolled_forward(tmp_path) -> None:
    world = _resumed_world(tmp_path)
    nodes = world.nodes()
    ends = {n: {"attempt": 9, "loss": 2.0, "tokens": 64} for n in world.stage0()}
    world.state.intent = CommitIntent(9, 4, world.state.roster.members(), ends, {n: {} for n in nodes})
    claims = {n: _claim(world, n, 5, 9) for n in nodes[:1]} | {
        n: _claim(world, n, 4, 9, 9) for n in nodes[1:]
    }
    world.state.reports.resumed = claims
    decision = world.enter(Adopting(15.0, {}, 0.0))
    assert decision.actions == [] and isinstance(decision.next, Adopted)
    assert decision.next.verdict.roll_forward and decision.next.verdict.stepped == nodes[:1]
    after = world.enter(decision.next)
    assert isinstance(after.next, FinishingCommit) and isinstance(after.next.then, Resumed)
    assert after.next.then.rolled == 4


def test_an_attempt_in_flight_is_aborted_and_redone_and_a_node_ahead_is_replaced(tmp_path) -> None:
    world = _resumed_world(tmp_path)
    nodes = world.nodes()
    claims = {n: _claim(world, n, 4, 10) for n in nodes[:-1]} | {nodes[-1]: _claim(world, nodes[-1], 5, 10)}
    world.state.reports.resumed = claims
    decision = world.enter(Adopting(15.0, {}, 0.0))
    kills = [a for a in decision.actions if a.op == "kill"]
    assert [a.args[0].occupant for a in kills] == nodes[-1:] and kills[0].kwargs == {"tell_peers": False}
    assert world.state.attempt == 10
    after = world.enter(decision.next)
    aborts = [(to, m) for to, c, m in world.link.sent if c == "abort"]
    assert aborts == [(n, {"attempt": 10}) for n in nodes[:-1]] and world.results.aborts == 1
    assert isinstance(after.next, Resumed) and after.next.redone == [4] and after.next.rolled is None
    assert world.state.current.phase == "over" and world.state.current.iteration == 4


def test_a_resume_with_every_node_gone_is_impossible(tmp_path) -> None:
    world = _resumed_world(tmp_path)
    decision = world.enter(Adopting(15.0, {n: "its process is gone" for n in world.nodes()}, 0.0))
    with pytest.raises(ResumeImpossible, match="no node of the swarm in .* is alive"):
        world.enter(decision.next)
