"""One planner: the simulator's strategies and the swarm pick the same rule and sources for every loss event."""

from __future__ import annotations

import itertools

import pytest

from checkfree.model import build_stages
from checkfree.recovery import make_strategy
from checkfree.recovery.planner import RecoveryImpossible, plan
from checkfree.swarm.strategies import make_recovery
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
        out[lost] = {r.stage: (r.rule, tuple(r.sources)) for r in records}
    return out


def swarm_choices(setting: str, n_stages: int) -> dict[tuple[int, ...], dict[int, tuple] | str]:
    strategy = make_recovery(setting)
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
