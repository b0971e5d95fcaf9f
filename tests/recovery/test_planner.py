"""One planner: the simulator's strategies and the swarm pick the same rule and sources for every loss event."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from checkfree.model import build_stages
from checkfree.recovery.math import stage0_part
from checkfree.recovery.planner import RecoveryImpossible, RecoveryPlan, plan, plan_ladder
from checkfree.recovery.registry import make_strategy
from checkfree.swarm.node.compute import build_stage
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.recovering import FetchContext, Recovery
from checkfree.swarm.policies import make_policy
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType
from checkfree.training_state import TrainingState, make_adam

from helpers import VOCAB, tiny_config

pytestmark = pytest.mark.timeout(120)


def events(n_stages: int) -> list[tuple[int, ...]]:
    """Every loss of one or two stages among 0..S."""
    stages = range(n_stages + 1)
    return [(s,) for s in stages] + list(itertools.combinations(stages, 2))


def simulator_choices(setting: str, n_stages: int) -> dict[tuple[int, ...], dict[int, tuple] | str]:
    cfg = tiny_config(n_stages=n_stages, dmodel=16, num_heads=2)
    stages = build_stages(cfg, VOCAB, 0)
    state = TrainingState(stages, [make_adam(s, cfg.lr) for s in stages], base_lr=cfg.lr)
    strategy = make_strategy(setting, cfg, swaps=setting == "checkfree_plus")
    strategy.setup(state)
    out: dict[tuple[int, ...], dict[int, tuple] | str] = {}
    for lost in events(n_stages):
        for s in lost:
            state.destroy(s)
        try:
            records = strategy.recover(state, list(lost))
        except ValueError:
            out[lost] = "impossible"
            for s in lost:  # put the destroyed stages back for the next event
                state.load_stage(s, {k: v.nan_to_num(0.0) for k, v in state.stage_state(s).items()})
            continue
        out[lost] = {r.stage: (r.rule, tuple(r.source_stages)) for r in records}
    return out


def swarm_choices(setting: str, n_stages: int) -> dict[tuple[int, ...], dict[int, tuple] | str]:
    strategy = make_policy(setting)
    out: dict[tuple[int, ...], dict[int, tuple] | str] = {}
    for lost in events(n_stages):
        try:
            plans = {s: strategy.plan(s, set(lost), n_stages) for s in lost}
        except RecoveryImpossible:
            out[lost] = "impossible"
            continue
        out[lost] = {s: (p.rule, tuple(p.sources)) for s, p in plans.items()}
    return out


@pytest.mark.parametrize("n_stages", [4, 6, 12])
@pytest.mark.parametrize(("sim", "swarm"), [("checkfree", "ours"), ("checkfree_plus", "ours-plus")])
def test_simulator_and_swarm_pick_the_same_rules_and_sources(n_stages, sim, swarm):
    a, b = simulator_choices(sim, n_stages), swarm_choices(swarm, n_stages)
    assert a == b
    assert (a[(0,)] == "impossible") == (sim == "checkfree")  # only CheckFree+ rebuilds stage 0


def test_planner_rules_by_hand():
    assert plan([2], 6, "checkfree")[2].sources == (1, 3)
    assert plan([2, 3], 6, "checkfree")[3].sources == (1, 4)  # consecutive: nearest live on each side
    assert plan([1], 6, "checkfree")[1].fallback == "single live neighbour: copy"
    assert (
        plan([1], 6, "checkfree_plus")[1].rule == "copy"
        and plan([1], 6, "checkfree_plus")[1].fallback is None
    )
    assert plan([6, 5], 6, "checkfree_plus")[6].sources == (4,)  # partner lost too: CheckFree's fallback copy
    assert plan([1], 6, "copy")[1].sources == (2,) and plan([3], 6, "zero")[3].rule == "zero"
    assert plan([1, 2], 4, "copy")[1].fallback == "intended source lost too: nearest live stage"
    assert plan([2], 4, "random")[2].rule == "random"
    assert plan([1, 2, 3, 4], 4, "average")[2].rule == "random"  # no live transformer stage at all
    assert plan([0, 4], 4, "checkfree_plus")[0].parts == ("embedding",)
    partial = plan([2], 4, "checkfree", live={0, 1, 2, 3, 4})[2]
    assert (partial.rule, partial.with_optimizer, partial.fresh_lr_scale) == ("replica", True, False)
    assert plan([2], 4, "checkfree", live={0, 1, 4})[2].sources == (1, 4)  # stage 3 serves no replica either
    with pytest.raises(RecoveryImpossible):
        plan([0], 4, "average")
    with pytest.raises(ValueError):
        plan([5], 4, "checkfree")


@pytest.mark.parametrize(
    ("rungs", "failed", "live", "stage", "rung", "rule", "sources"),
    [
        (("replica", "random"), [2], {0, 1, 2, 3, 4}, 2, "replica", "replica", (2,)),  # swarm: a live replica
        (("redundant", "random"), [2], None, 2, "redundant", "replica", (1,)),  # Bamboo copy on stage 1
        (("redundant", "random"), [0], None, 0, "redundant", "replica", (4,)),  # stage 0's copy: on stage S
        (("ec_snapshot", "random"), [3], None, 3, "ec_snapshot", "ec_decode", (1, 2, 4)),
        (("neighbour",), [2], None, 2, "neighbour", "checkfree", (1, 3)),
        (("neighbour",), [0], None, 0, "neighbour", "stage0_copy", (1, 4)),
        (("random",), [2], None, 2, "random", "random", ()),
        # the full ladder steps down: 2's holder (1) survived; 3's holder (2) died, and two losses defeat parity
        (
            ("redundant", "ec_snapshot", "neighbour", "random"),
            [2, 3],
            None,
            3,
            "neighbour",
            "checkfree",
            (2, 4),
        ),
        (("redundant", "ec_snapshot", "neighbour", "random"), [2, 3], None, 2, "redundant", "replica", (1,)),
        (("ec_snapshot", "neighbour"), [0, 1], None, 0, "neighbour", "stage0_copy", (4,)),  # E's holder lost
    ],
)
def test_ladder_picks_each_rung_when_it_is_the_one_available(rungs, failed, live, stage, rung, rule, sources):
    p = plan_ladder(failed, 4, rungs, live=live, ec_fresh=True)[stage]
    assert (p.rung, p.rule, p.sources) == (rung, rule, sources)


def test_swarm_ladder_takes_a_live_replica_then_the_neighbour_rule():
    ladder = make_policy("ladder")
    assert ladder.swaps and ladder.keeps_stage0_copy
    assert ladder.plan(2, set(), 4).rung == "replica"
    assert (ladder.plan(2, {2}, 4).rung, ladder.plan(2, {2}, 4).sources) == ("neighbour", (1, 3))
    assert ladder.plan(0, {0}, 4).rule == "stage0_copy"
    assert ladder.plan(2, {1, 2, 3, 4}, 4).rule == "random"  # no transformer stage survives: as the simulator
    assert not plan_ladder([3], 4, ("ec_snapshot", "random"), ec_fresh=False)[3].rung == "ec_snapshot"


def test_a_plan_travels_as_json_and_a_bad_one_is_refused():
    for p in (plan([0, 1], 4, "checkfree_plus")[0], plan_ladder([2], 4, ("redundant", "random"))[2]):
        assert RecoveryPlan.from_json(p.to_json(), 4) == p
    good = plan([2], 4, "checkfree")[2].to_json()
    bad = [
        None,
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "rung"},
        {**good, "rule": "teleport"},
        {**good, "sources": [1, 9]},
        {**good, "sources": [True]},
        {**good, "parts": ["tail"]},
        {**good, "with_optimizer": "yes"},
        {**good, "fallback": 3},
    ]
    for data in bad:
        with pytest.raises(ValueError):
            RecoveryPlan.from_json(data, 4)


SEED, ITERATION = 7, 11
"""The run seed and the iteration of the loss event that seed a random re-initialisation."""


def _simulator_after(lost: list[int]) -> tuple[TrainingState, dict]:
    """The simulator's CheckFree+ state after losing ``lost`` at iteration ITERATION, and the copies it held."""
    cfg = tiny_config(n_stages=4, dmodel=16, num_heads=2, seed=SEED)
    stages = build_stages(cfg, VOCAB, 0)
    state = TrainingState(stages, [make_adam(s, cfg.lr) for s in stages], base_lr=cfg.lr)
    strategy = make_strategy("checkfree_plus", cfg, swaps=True, seed=SEED)
    strategy.setup(state)
    copies = {k: v.clone() for k, v in strategy.stage0_copy.items()}
    state.iteration = ITERATION
    for s in lost:
        state.destroy(s)
    strategy.recover(state, lost)
    return state, copies


def _swarm_rebuild(stage: int, lost: set[int], copies: dict) -> tuple[StageState, dict]:
    """A swarm replacement of ``stage`` executing its setting's plan: its own fresh stage (another init), the
    stage-0 copies answered by node 11 (stage 1) and 14 (stage S), the WELCOME's iteration (the event's + 1)."""
    cfg = SimpleNamespace(
        request_timeout=60.0, max_attempts=1, storage_id=99, init_seed=SEED, model=tiny_config(seed=SEED)
    )
    module = build_stage(tiny_config(n_stages=4, dmodel=16, num_heads=2), stage, VOCAB, 3)
    state = StageState(module, make_adam(module, 1e-3))
    sent: list[tuple[int, dict]] = []
    done: list[tuple[StageState, dict]] = []
    membership = Membership(50, peers={11: {"stage": 1}, 14: {"stage": 4}}, members={1: [11], 4: [14]})
    node = NodeContext(
        node_id=50,
        stage=stage,
        clock=AttemptClock(max_version=ITERATION + 1),
        membership=membership,
        send=lambda p, t, *a, meta=None, **k: sent.append((p, meta)),
    )
    ctx = FetchContext(node=node, cfg=cfg, reject=lambda m, w: None)
    ctx.iteration = max((ITERATION + 1) - 1, 0)  # as Node.run derives it from the WELCOME
    plan = make_policy("ours-plus").plan(stage, lost, 4)
    rec = Recovery(ctx, plan, state, lambda *d: done.append(d), pytest.fail)
    rec.start()
    for peer, meta in sent:
        part = {k: v for k, v in copies.items() if stage0_part(k) == meta["part"]}
        tensors = {f"w.{k}": v for k, v in part.items()}
        reply = {"stage": 0, "part": meta["part"], "request": meta["request"], "version": ITERATION}
        rec.on_response(
            Message(MessageType.WEIGHTS_RESPONSE, peer, meta=reply | {"grad_norm": 1.0}, tensors=tensors)
        )
    ((rebuilt, record),) = done
    return rebuilt, record


@pytest.mark.parametrize(
    ("lost", "stage", "rule"),
    [([0, 4], 0, "stage0_copy"), ([0, 1], 0, "stage0_copy"), ([1, 2, 3, 4], 2, "random")],
)
def test_the_swarm_rebuilds_a_lost_stage_bit_identically_to_the_simulator(lost, stage, rule):
    """A stage-0 part whose copy holder is lost too, and a stage with no transformer stage left: both get the
    simulator's seeded random init (run seed, iteration of the event, stage), the rest the same copies."""
    sim, copies = _simulator_after(lost)
    rebuilt, record = _swarm_rebuild(stage, set(lost), copies)
    assert record["rule"] == rule and "random init" in record["fallback"]
    want = sim.stages[stage].state_dict()
    got = rebuilt.module.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k
    lr = tiny_config().lr * tiny_config().lr_scale
    assert W.current_lr(rebuilt.opt) == pytest.approx(lr)  # a fresh Adam at lr × lr_scale, as the simulator's
