"""The attempt phase without sockets (tests/helpers/phases.py): begin → sync → commit intent journaled → commit →
committed; a death before the commit aborts it; a stall or a passed deadline retries it, at most max_attempts."""

from __future__ import annotations

import pytest

from checkfree.swarm.supervisor.phases.after_commit import AfterCommit
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.base import Act, kill
from checkfree.swarm.supervisor.phases.between import Between
from checkfree.swarm.supervisor.state import SwarmError

from helpers.phases import World


def _ends(world: World, attempt: int) -> None:
    world.reports("iteration_end", world.stage0(), attempt=attempt, loss=2.0, tokens=64)


def test_a_death_mid_attempt_aborts_it_everywhere_and_the_iteration_is_redone(tmp_path) -> None:
    world = World(tmp_path)
    phase = Attempting(3)
    world.enter(phase)
    assert world.link.commands() == ["begin"] and world.state.current.number == 1
    _ends(world, 1)
    assert world.turn(phase).actions == [Act("link", "broadcast", ("sync",), {"attempt": 1})]
    world.carry_out(
        [kill(world.state.roster.slots[2], "test")]
    )  # a member (a non-member's death aborts nothing)
    decision = world.turn(phase, died=True)
    assert isinstance(decision.next, Between) and decision.result is False
    assert world.link.commands()[-1] == "abort" and world.results.aborts == 1
    assert world.state.current.phase == "over" and world.state.iteration == 0


def test_a_commit_is_journaled_before_its_broadcast_and_a_death_after_it_does_not_abort(tmp_path) -> None:
    world = World(tmp_path)
    phase = Attempting(3)
    world.state.iteration = 3
    world.enter(phase)
    _ends(world, 1)
    world.turn(phase)
    world.reports("ready", world.nodes(), attempt=1, grad_norm=1.0, pipelines=1)
    decision = world.turn(phase)
    ops = [(a.part, a.op) for a in decision.actions]
    assert ops == [("journal", "write"), ("supervisor", "commit_held")]  # the intent first
    assert decision.actions[0].args == ("commit of iteration 3",)
    intent = world.state.intent
    assert (intent.iteration, intent.attempt, set(intent.ends)) == (3, 1, set(world.stage0()))
    assert world.link.commands()[-1] == "commit" and phase.holds_signals(world.ctx)
    assert world.turn(phase, died=True).next is phase  # the survivors step: no abort once it went out
    world.reports("committed", world.nodes(), attempt=1, version=4)
    decision = world.turn(phase)
    assert isinstance(decision.next, AfterCommit) and decision.result is True
    assert world.results.rows[-1]["iteration"] == 3 and world.state.iteration == 4
    assert world.state.commit_unjournaled and world.state.commits == 1


def test_a_passed_deadline_retries_the_attempt_and_max_attempts_stops_the_run(tmp_path) -> None:
    world = World(tmp_path)
    limit, timeout = world.cfg.max_attempts, world.cfg.iteration_timeout
    for failed in range(1, limit):
        phase = Attempting(3)
        world.enter(phase)
        assert world.turn(phase, dt=timeout / 2).next is phase
        decision = world.turn(phase, dt=timeout / 2 + 1)
        assert isinstance(decision.next, Between) and decision.result is False
        assert world.state.failed_attempts[3] == failed and world.link.commands()[-1] == "abort"
    phase = Attempting(3)
    world.enter(phase)
    with pytest.raises(
        SwarmError, match=f"iteration 3 failed {limit} attempts; last: no commit within 300 s"
    ):
        world.turn(phase, dt=timeout + 1)
    assert world.link.commands()[-1] == "abort"


def test_a_stall_retries_the_attempt(tmp_path) -> None:
    world = World(tmp_path)
    phase = Attempting(0)
    world.enter(phase)
    world.reports("stalled", world.stage0()[:1], attempt=1, reason="microbatch 0 not back")
    decision = world.turn(phase)
    assert decision.actions[0] == Act("attempts", "retry", ("stalled: microbatch 0 not back",))
    assert isinstance(decision.next, Between) and world.state.failed_attempts == {0: 1}


def test_a_scheduled_crash_fires_at_its_point_journaled_first_and_its_death_aborts(tmp_path) -> None:
    world = World(tmp_path, schedule={1: [3]})
    phase = Attempting(3)
    world.enter(phase)  # crash_point 0.5 × the last iteration's 1 s (none yet)
    assert world.turn(phase, dt=0.4).actions == []
    decision = world.turn(phase, dt=0.2)
    ops = [(a.part, a.op) for a in decision.actions]
    assert ops == [("journal", "write"), ("results", "scheduled_kill"), ("processes", "kill")]
    assert (1, 3) in world.state.fired and world.state.roster.slots[1].dead
    assert isinstance(world.turn(phase, died=True).next, Between)


def test_a_replica_death_in_the_forward_phase_reroutes_the_attempt_and_a_stage_lost_aborts_it(
    tmp_path,
) -> None:
    """2 replicas per stage (slots 2 and 3 hold stage 1). Slot 2's scheduled death leaves stage 1 node 3: every
    live node gets ``reroute`` (the lists less node 2), pipeline 0 (which crossed node 2) must end again, and the
    attempt goes on to its commit; the row counts the re-route. Slot 3's death then loses stage 1 whole: abort
    (issue 39 point 1)."""
    world = World(tmp_path, schedule={2: [3]}, replicas=2)
    phase = Attempting(3)
    world.enter(phase)
    _ends(world, 1)  # both pipelines ended before the crash: it fires at once
    world.turn(phase)
    decision = world.turn(phase, died=True)
    assert decision.next is phase and world.acts("attempts", "reroute")[0].args == ([2],)
    (reroute,) = [m for _, c, m in world.link.sent if c == "reroute"]
    assert reroute["members"]["1"] == [3] and reroute["dead"] == [2] and reroute["seq"] == 1
    assert set(world.state.reports.iteration_end) == {1}  # pipeline 0's end is stale: it goes again
    assert world.turn(phase).actions == []  # no sync before pipeline 0 ends again
    world.reports("iteration_end", [0], attempt=1, loss=2.0, tokens=64, resent=3, reroutes=1)
    assert world.turn(phase).actions == [Act("link", "broadcast", ("sync",), {"attempt": 1})]
    live = [n for n in world.nodes() if n != 2]
    world.reports("ready", live, attempt=1, grad_norm=1.0, pipelines=2)
    world.turn(phase)
    world.reports("committed", live, attempt=1, version=4)
    assert world.turn(phase).result is True
    row = world.results.rows[-1]
    assert (row["rerouted"], row["resent_microbatches"], world.results.aborts) == (1, 3, 0)

    phase = Attempting(4)
    world.enter(phase)
    world.state.roster.by_node[3].died()  # stage 1's last replica
    assert isinstance(world.turn(phase, died=True).next, Between) and world.results.aborts == 1


def test_a_replica_death_after_sync_went_out_still_aborts(tmp_path) -> None:
    world = World(tmp_path, replicas=2)
    phase = Attempting(3)
    world.enter(phase)
    _ends(world, 1)
    assert world.turn(phase).actions == [Act("link", "broadcast", ("sync",), {"attempt": 1})]
    world.state.roster.by_node[2].died()  # a stage-1 replica, its stage still served by node 3
    assert isinstance(world.turn(phase, died=True).next, Between) and world.results.aborts == 1
    assert "reroute" not in world.link.commands()
