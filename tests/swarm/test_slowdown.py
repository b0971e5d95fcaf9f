"""Slowdown emulation (issue 39 point 4; checkfree.swarm.slowdown): the config's ``slowdown`` and a schedule's
``slowdowns`` events, refused in one sentence when off their schema, turned into per-attempt factors that the
supervisor sends with ``begin``, and a worker of factor f whose passes take f × their measured time."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from checkfree.config import ConfigError, load_config
from checkfree.failures.schedules import load_swarm_schedule
from checkfree.swarm.config import SwarmConfig, swarm_config_from_dict
from checkfree.swarm.node import compute
from checkfree.swarm.node.compute import StageWorker, build_stage
from checkfree.swarm.slowdown import SlowdownPlan, SlowEvent, load_slowdowns, parse_slowdowns
from checkfree.swarm.wire.control import check, control
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

from helpers.cli import assert_user_error, run_cli, swarm_argv
from helpers.phases import World

TINY = {"model_config": "tiny_config.json"}
CFG = load_config("tiny_config.json", {"dmodel": 64, "num_heads": 2, "seq_l": 32, "batch_size": 4})


@pytest.mark.parametrize(
    "value, says",
    [
        ({"3": 0.5}, "'slowdown.3' is 0.5; expected a value greater than or equal to 1"),
        ({"3": 1001}, "'slowdown.3' is 1001"),
        ({"3": float("nan")}, "'slowdown.3' is nan"),
        ({"x": 2}, "'slowdown.x[key]' is 'x'"),
        ([3], "'slowdown' is [3]; expected an object"),
        ({"10": 2}, "'slowdown' names slot 10; expected slots 0..9"),
    ],
)
def test_a_bad_slowdown_in_the_config_is_one_sentence(value: object, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        swarm_config_from_dict(TINY | {"slowdown": value}, "swarm config s.json")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_last_slot_is_accepted() -> None:
    """Slots 0 .. n_nodes − 1 (swarm_tiny's defaults: 5 stages × 2 = 10): 9 passes, 10 did not above."""
    assert SwarmConfig(model_config="tiny_config.json", slowdown={"9": 3.0}).slowdown == {"9": 3.0}


@pytest.mark.parametrize(
    "events, says",
    [
        ({"slot": 1, "factor": 0.9, "iteration": 3}, "slowdowns[0] has factor 0.9"),
        ({"slot": 10, "factor": 2, "iteration": 3}, "slowdowns[0] names slot 10; expected slots 0..9"),
        ({"slot": -1, "factor": 2, "iteration": 3}, "names slot -1"),
        ({"slot": 1, "factor": 2, "iteration": -1}, "has iteration -1"),
        ({"slot": 1, "factor": True, "iteration": 3}, "slowdowns[0] is"),
        ({"slot": 1, "factor": 2}, "slowdowns[0] is"),
    ],
)
def test_a_bad_slowdown_event_is_one_sentence(events: dict, says: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_slowdowns([events], "failure schedule 's.json'", 10)
    assert says in str(e.value) and str(e.value).startswith("failure schedule 's.json': ")


def test_a_schedule_with_slowdowns_is_still_a_crash_schedule(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"3": [5, 100], "slowdowns": [{"slot": 4, "factor": 3, "iteration": 2}]}))
    assert load_swarm_schedule(path) == {3: [5]}
    assert load_slowdowns(path, 10) == [SlowEvent(4, 3.0, 2)]
    assert load_slowdowns(None, 10) == []


def test_swarm_run_refuses_a_bad_slowdown_before_anything_starts(tmp_path: Path, capsys) -> None:
    """Exit 2, one line, and no run directory: the schedule's events and the config's map are checked while the
    run is planned."""
    schedule = tmp_path / "s.json"
    schedule.write_text(json.dumps({"slowdowns": [{"slot": 4, "factor": 0.5, "iteration": 2}]}))
    argv = [a for a in swarm_argv(tmp_path) if a != "--no-schedule"]
    rc, _, err = run_cli([*argv, "--schedule", str(schedule), "--iterations", "2"], capsys)
    assert_user_error(rc, err, "slowdowns[0] has factor 0.5")
    rc, _, err = run_cli([*swarm_argv(tmp_path), "--set", 'slowdown={"4": 0}', "--iterations", "2"], capsys)
    assert_user_error(rc, err, "'slowdown.4' is 0")
    assert not (tmp_path / "run").exists()


def test_a_schedule_event_switches_the_slot_slow_at_its_iteration() -> None:
    """The config's factor holds from iteration 0; an event replaces a slot's factor from its iteration on (not
    one before), and factor 1 ends it."""
    plan = SlowdownPlan({"2": 2.0}, [SlowEvent(4, 3.0, 10), SlowEvent(2, 1.0, 12), SlowEvent(4, 4.0, 15)])
    assert plan.factors(0) == {2: 2.0}
    assert plan.factors(9) == {2: 2.0}
    assert plan.factors(10) == {2: 2.0, 4: 3.0}
    assert plan.factors(12) == {4: 3.0}
    assert plan.factors(14) == {4: 3.0} and plan.factors(15) == {4: 4.0}


def test_begin_carries_the_factor_of_the_slots_occupant(tmp_path: Path) -> None:
    """The supervisor sends each attempt's factors with ``begin``, by node id: a replacement of a slow slot is
    slow too, and an attempt before the event sends none."""
    world = World(tmp_path, replicas=2)
    world.attempts.slowdowns = SlowdownPlan(None, [SlowEvent(3, 3.0, 1)])
    world.attempts.begin(0, [], 1.0)
    assert "slowdown" not in world.link.sent[-1][2]
    slot = world.state.roster.slots[3]
    slot.started(42, float("inf"))  # a replacement took the slot
    world.attempts.begin(1, [], 1.0)
    assert world.link.sent[-1][1] == "begin" and world.link.sent[-1][2]["slowdown"] == {"42": 3.0}


@pytest.mark.parametrize("bad", [{"3": 0.5}, {"3": 1e9}, {"x": 2.0}, {"3": float("nan")}])
def test_a_begin_with_a_bad_factor_is_refused_on_the_wire(bad: dict) -> None:
    meta = {"command": "begin", "attempt": 1, "iteration": 0, "members": {"0": [0]}}
    check(Message(MessageType.CONTROL, -1, 0, -1, meta | {"slowdown": {"3": 3}}))
    with pytest.raises(ProtocolError):
        check(Message(MessageType.CONTROL, -1, 0, -1, meta | {"slowdown": bad}))


@pytest.mark.parametrize("bad", [-0.1, float("inf"), "1"])
def test_a_committed_with_a_bad_microbatch_time_is_refused_on_the_wire(bad: object) -> None:
    meta = control(
        "committed",
        attempt=1,
        sent_bytes={},
        sent_messages={},
        dropped_malformed=0,
        bad_messages=0,
        compute={},
        version=1,
        microbatch_s=0.5,
    )
    check(Message(MessageType.CONTROL, 3, 0, -1, meta))
    with pytest.raises(ProtocolError):
        check(Message(MessageType.CONTROL, 3, 0, -1, meta | {"microbatch_s": bad}))


def test_a_slowed_pass_sleeps_factor_minus_one_times_its_measured_seconds(monkeypatch) -> None:
    """On a fake clock: a pass that took 0.01 s on a factor-3 worker sleeps 0.02 s and counts 0.03 s."""
    now = [100.0]
    slept: list[float] = []

    def sleep(d: float) -> None:
        slept.append(d)
        now[0] += d

    monkeypatch.setattr(compute.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(compute.time, "sleep", sleep)
    worker = StageWorker(build_stage(CFG, 1, 64, seed=1), 1)
    worker.slowdown = 3.0
    worker._count("forward", now[0] - 0.01)
    assert slept == [pytest.approx(0.02)]
    assert worker.compute["forward_s"] == pytest.approx(0.03) and worker.attempt_s == pytest.approx(0.03)
    worker.slowdown = 1.0
    worker._count("backward", now[0] - 0.01)
    assert len(slept) == 1 and worker.compute["backward_s"] == pytest.approx(0.01)


def _microbatch_seconds(worker: StageWorker, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    x = torch.randn(CFG.batch_size, CFG.seq_l, CFG.dmodel, generator=gen)
    y = worker.forward((0, k), x)
    worker.backward((0, k), torch.ones_like(y))


@pytest.mark.timeout(120)
def test_a_factor_3_worker_measures_about_3x_per_microbatch() -> None:
    """Two workers of one stage, one of factor 3, their microbatches interleaved (so the machine's load hits both
    alike): the slow one's measured seconds per microbatch are about 3× the other's (generous bounds; the ratio is
    compared within this run, never an absolute time)."""
    torch.manual_seed(0)
    fast = StageWorker(build_stage(CFG, 1, 64, seed=1), 1)
    slow = StageWorker(build_stage(CFG, 1, 64, seed=1), 1)
    slow.slowdown = 3.0
    for w in (fast, slow):  # warm-up, not measured
        _microbatch_seconds(w, 1, 99)
        w.reset()
    t0 = time.perf_counter()
    for k in range(8):
        _microbatch_seconds(fast, 1, k)
        _microbatch_seconds(slow, 1, k)
    assert time.perf_counter() - t0 < 100
    ratio = slow.microbatch_seconds() / fast.microbatch_seconds()
    assert 2.0 < ratio < 4.5, ratio
    assert fast.microbatches == slow.microbatches == 8
    slow.reset()
    assert slow.microbatch_seconds() is None and slow.attempt_s == 0.0
