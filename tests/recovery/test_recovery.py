"""Recovery math on hand-built tensors, and every neighbour strategy acting on a TrainingState."""

import math

import pytest
import torch
from torch import nn

from checkfree.recovery.math import (
    average,
    checkfree_shares,
    random_state,
    weighted_average,
    zero_mlp_output,
)
from checkfree.recovery.planner import live_neighbours
from checkfree.recovery.registry import REGISTRY, make_strategy, resolve_setting
from checkfree.sim.trainer import RunContext
from checkfree.telemetry.metrics import MetricsSink
from checkfree.training_state import TrainingState, make_adam

from helpers import tiny_config

L = {"w": torch.tensor([[1.0, 2.0]]), "b": torch.tensor([0.0])}
R = {"w": torch.tensor([[3.0, 6.0]]), "b": torch.tensor([4.0])}


def test_weighted_average_is_the_paper_formula():
    # W = (ω_l W_l + ω_r W_r) / (ω_l + ω_r) with ω = (1, 3): (1·1 + 3·3)/4 = 2.5, (1·2 + 3·6)/4 = 5
    out = weighted_average(L, R, 1.0, 3.0)
    assert torch.equal(out["w"], torch.tensor([[2.5, 5.0]]))
    assert torch.equal(out["b"], torch.tensor([3.0]))


def test_average_and_zero_weights():
    assert torch.equal(average(L, R)["w"], torch.tensor([[2.0, 4.0]]))
    assert torch.equal(weighted_average(L, R, 0.0, 0.0)["w"], torch.tensor([[2.0, 4.0]]))


@pytest.mark.parametrize(
    "w_left, w_right, shares",
    [
        (1e308, 1e308, (0.5, 0.5)),  # ω_l + ω_r overflows to inf: the shares used to be 0/0 = zero
        (1e308, 0.75e308, (4 / 7, 3 / 7)),
        (1e308, 1e-308, (1.0, 0.0)),  # one huge, one tiny: the tiny one's share underflows to 0
        (5e-324, 0.0, (1.0, 0.0)),  # the smallest subnormal still takes everything from a zero
        (1e-308, 3e-308, (0.25, 0.75)),
        (0.0, 0.0, (0.5, 0.5)),  # documented: both zero is the plain average
    ],
)
def test_weighted_average_never_overflows_and_its_shares_add_up_to_one(w_left, w_right, shares):
    out = weighted_average(L, R, w_left, w_right)
    expected = {k: shares[0] * L[k] + shares[1] * R[k] for k in L}
    for k in L:
        assert torch.allclose(out[k], expected[k], rtol=1e-6, atol=0), (k, out[k])
    assert checkfree_shares(w_left, w_right) == pytest.approx(shares, rel=1e-12, abs=0)
    assert sum(checkfree_shares(w_left, w_right)) == pytest.approx(1.0, rel=1e-15)


def test_checkfree_records_finite_shares_for_huge_gradient_norms():
    state, (rec,) = run("checkfree", [2], state=make_state(norms=(1.0, 1e308, 1.0, 1e308, 1.0)))
    assert weight(state, 2) == pytest.approx(2.0) and rec.weights == [0.5, 0.5]


def test_weighted_average_rejects_mismatch():
    with pytest.raises(ValueError, match="differ in keys"):
        weighted_average(L, {"w": R["w"]}, 1, 1)
    with pytest.raises(ValueError, match="shapes"):
        weighted_average(L, {"w": torch.zeros(2, 2), "b": R["b"]}, 1, 1)
    with pytest.raises(ValueError, match="weight nan"):
        weighted_average(L, R, float("nan"), 1)
    for bad in (float("inf"), -1.0):
        with pytest.raises(ValueError, match="expected a finite number ≥ 0"):
            weighted_average(L, R, 1.0, bad)


def test_zero_and_random_rules():
    sd = {
        "layers.0.mlp.down_proj.weight": torch.ones(2, 2),
        "layers.0.mlp.up_proj.weight": torch.ones(2, 2),
        "layers.0.input_layernorm.weight": torch.full((2,), 3.0),
    }
    z = zero_mlp_output(sd, "LLaMa")
    assert z["layers.0.mlp.down_proj.weight"].abs().sum() == 0
    assert torch.equal(z["layers.0.mlp.up_proj.weight"], torch.ones(2, 2))
    r = random_state(
        {"a.weight": torch.zeros(200, 200), "x.norm.weight": torch.zeros(4)},
        torch.Generator().manual_seed(0),
        std=0.02,
    )
    assert abs(r["a.weight"].std().item() - 0.02) < 1e-3
    assert torch.equal(r["x.norm.weight"], torch.ones(4))


@pytest.mark.parametrize(
    "stage, failed, expected",
    [
        (2, [2], (1, 3)),
        (1, [1], (None, 2)),
        (4, [4], (3, None)),
        (2, [2, 3], (1, 4)),
        (3, [2, 3], (1, 4)),
        (2, [1, 2, 3, 4], (None, None)),
        (5, [3, 4, 5], (2, 6)),  # two lost stages on the left are skipped
        (3, [3, 4, 5], (2, 6)),  # and two on the right
        (6, [4, 5, 6], (3, None)),
    ],
)
def test_live_neighbours_skip_stages_lost_in_the_same_iteration(stage, failed, expected):
    assert live_neighbours(stage, failed, 6 if max(failed) > 4 else 4) == expected


def test_aliases_follow_the_swap_flag():
    assert resolve_setting("ours-grad-avg", swaps=True) == "checkfree_plus"
    assert resolve_setting("ours-grad-avg", swaps=False) == "checkfree"
    assert resolve_setting("ours-grad-avg-regularize", swaps=True) == "checkfree_plus"
    assert resolve_setting("ours-naive", swaps=False) == "copy"
    assert resolve_setting("ours-random", swaps=False) == "random"
    assert resolve_setting("ours-zero", swaps=False) == "zero"
    assert resolve_setting("ours-avg-ablation", swaps=False) == "average"
    with pytest.raises(ValueError, match="unknown setting 'ours-magic'"):
        resolve_setting("ours-magic", swaps=False)
    with pytest.raises(ValueError, match="needs CheckFree\\+ swaps"):
        make_strategy("checkfree_plus", tiny_config(), swaps=False)


# ------------------------------------------------------------------ strategies on a TrainingState


class Block(nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2)])
        with torch.no_grad():
            self.layers[0].weight.fill_(value)
            self.layers[0].bias.fill_(value)


def make_state(values=(0.0, 1.0, 2.0, 3.0, 4.0), norms=(1.0, 1.0, 2.0, 3.0, 6.0)) -> TrainingState:
    stages = [Block(v) for v in values]
    state = TrainingState(stages, [make_adam(s, 0.01) for s in stages], base_lr=0.01, grad_norms=list(norms))
    return state


def weight(state, s):
    return state.stages[s].layers[0].weight[0, 0].item()


def run(setting, failed, swaps=False, state=None):
    state = state or make_state()
    strategy = make_strategy(setting, tiny_config(), swaps)
    strategy.setup(state)
    for s in failed:
        state.destroy(s)
    return state, strategy.recover(state, failed)


def test_checkfree_uses_gradient_norm_weights():
    state, (rec,) = run("checkfree", [2])
    # ω_1 = 1, ω_3 = 3: (1·1 + 3·3) / 4 = 2.5
    assert weight(state, 2) == pytest.approx(2.5)
    assert rec.source_stages == [1, 3] and rec.weights == pytest.approx([0.25, 0.75]) and rec.fallback is None


def test_checkfree_clipped_mode_is_the_release_variant():
    cfg = tiny_config(grad_norm_mode="clipped")
    state = make_state()
    strategy = make_strategy("checkfree", cfg, False)
    state.destroy(2)
    strategy.recover(state, [2])
    # both norms ≥ 1 are clipped to ≈1 (+1e-4): nearly the plain average (1 + 3) / 2
    assert weight(state, 2) == pytest.approx(2.0, abs=1e-4)


def test_recovered_stage_gets_fresh_adam_at_scaled_lr():
    state, _ = run("checkfree", [3])
    assert state.lr_multipliers[3] == pytest.approx(1.1)
    assert state.optimizers[3].param_groups[0]["lr"] == pytest.approx(0.011)
    assert not state.optimizers[3].state  # Adam moments reset


def test_checkfree_first_stage_falls_back_to_copy():
    state, (rec,) = run("checkfree", [1])
    assert weight(state, 1) == 2.0 and rec.fallback and rec.source_stages == [2]


def test_checkfree_plus_copies_first_and_last_from_partners():
    state, recs = run("checkfree_plus", [1, 4], swaps=True)
    assert weight(state, 1) == 2.0 and weight(state, 4) == 3.0
    assert all(r.fallback is None for r in recs)


def test_consecutive_failures_use_nearest_live_stages():
    state, recs = run("checkfree", [2, 3])
    # stage 2: neighbours 1 (ω=1) and 4 (ω=6): (1·1 + 6·4)/7
    assert weight(state, 2) == pytest.approx(25 / 7)
    assert weight(state, 3) == pytest.approx(25 / 7)
    assert all(r.consecutive for r in recs)


def test_copy_average_zero_random():
    state, _ = run("copy", [3])
    assert weight(state, 3) == 2.0
    state, _ = run("copy", [1])
    assert weight(state, 1) == 2.0
    state, _ = run("average", [2])
    assert weight(state, 2) == 2.0
    state, (rec,) = run("random", [2])
    assert abs(weight(state, 2)) < 0.2 and rec.rule == "random"


def test_random_reinit_differs_per_stage_and_repeats_per_run():
    """Two stages lost together get independent fresh weights; the same failure in another run (or on another
    data-parallel rank) gets the same ones."""
    state, _ = run("random", [2, 3])
    again, _ = run("random", [2, 3])
    w = [state.stages[s].layers[0].weight for s in (2, 3)]
    assert not torch.equal(w[0], w[1])
    assert torch.equal(w[0], again.stages[2].layers[0].weight)


def test_checkfree_plus_restores_stage0_from_neighbour_copy():
    state = make_state()
    strategy = make_strategy("checkfree_plus", tiny_config(), True)
    strategy.setup(state)
    with torch.no_grad():
        state.stages[0].layers[0].weight.fill_(7.0)  # a training step changed stage 0 …
    strategy.after_step(state)  # … and its copies next door were refreshed
    state.destroy(0)
    (rec,) = strategy.recover(state, [0])
    assert weight(state, 0) == 7.0 and rec.fallback is None


def test_no_failure_strategy_keeps_state():
    state = make_state()
    strategy = make_strategy("no_failure", tiny_config(), False)
    assert strategy.recover(state, [2]) == [] and not strategy.loses_state


@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if c.loses_state))
def test_contract_every_strategy_rebuilds_every_failed_stage(name):
    """Contract test: after recover(), no NaN survives in any stage and there is one record per stage."""
    from helpers import make_trainer

    cfg = tiny_config()
    swaps = REGISTRY[name].swaps
    trainer = make_trainer(cfg, name, swaps=swaps)
    trainer.strategy.setup(trainer.state)
    trainer.step()
    trainer.strategy.after_step(trainer.state)
    failed = [2, 3]
    for s in failed:
        trainer.state.destroy(s)
    records = trainer.strategy.recover(trainer.state, failed)
    assert sorted(r.stage for r in records) == failed
    for stage in trainer.state.stages:
        assert all(torch.isfinite(p).all() for p in stage.parameters())
    assert math.isfinite(trainer.step())


@pytest.mark.parametrize(
    "setting, failed, stage, expected",
    [
        # redundant: stage 2 comes back from stage 1's replica (2.0); stage 3's replica died with stage 2, so
        # CheckFree from stage 2 (ω=2, value 2) and stage 4 (ω=6, value 4): (2·2 + 6·4) / 8 = 3.5
        ("redundant", [2, 3], 3, 3.5),
        # ec_snapshot: two losses, one parity block: CheckFree from 1 (ω=1, value 1) and 4 (ω=6, value 4)
        ("ec_snapshot", [2, 3], 2, 25 / 7),
        ("ec_snapshot", [2, 3], 3, 25 / 7),
    ],
)
def test_baseline_fallbacks_weight_each_neighbour_by_its_own_gradient_norm(setting, failed, stage, expected):
    """The CheckFree fallback of redundant and ec_snapshot gives ω_left to the left stage (not swapped)."""
    state = make_state()
    strategy = make_strategy(setting, tiny_config(snapshot_every=4), False)
    strategy.bind(RunContext(sink=MetricsSink(None)))  # ec_snapshot writes its "snapshot" lines through it
    strategy.setup(state)
    strategy.begin_iteration(state, failed)
    for s in failed:
        state.destroy(s)
    records = {r.stage: r for r in strategy.recover(state, failed)}
    assert weight(state, stage) == pytest.approx(expected)
    assert records[stage].rule == "checkfree" and records[stage].fallback
    left, right = records[stage].source_stages
    omega = state.grad_norms
    assert records[stage].weights == pytest.approx(
        [omega[left] / (omega[left] + omega[right]), omega[right] / (omega[left] + omega[right])]
    )
