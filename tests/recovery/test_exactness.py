"""What the exact-restore baselines (redundant, ec_snapshot) bring back besides the weights: the LR multiplier of
a stage recovered earlier, Adam state after any number of steps, the right replica holder on the ring over 0..S,
and the staleness they record."""

from __future__ import annotations

import pytest
import torch

from checkfree.recovery.redundant import predecessor
from checkfree.recovery.stage_copy import flatten, restore_copy, take_copy, unflatten

from helpers import ScriptedFailures, make_trainer, tiny_config

pytestmark = pytest.mark.timeout(60)


def adam_and_weights(trainer, stage: int) -> list[torch.Tensor]:
    copy = take_copy(trainer.state, stage)
    return list(copy.weights.values()) + [
        t for i in sorted(copy.optimizer) for _, t in sorted(copy.optimizer[i].items())
    ]


def fail(trainer, stages: list[int]):
    trainer.strategy.begin_iteration(trainer.state, stages)
    st = trainer.state
    for s in stages:
        st.destroy(s)
    return {r.stage: r for r in trainer.strategy.recover(st, stages)}


@pytest.mark.parametrize("setting", ["redundant", "ec_snapshot"])
def test_an_exact_restore_keeps_the_lr_multiplier_of_a_stage_recovered_before(setting):
    cfg = tiny_config(snapshot_every=2, lr_scale=1.25)
    t = make_trainer(cfg, setting)
    t.state.fresh_optimizer(2, cfg.lr_scale)  # stage 2 was rebuilt earlier: it trains at lr × 1.25
    t.strategy.setup(t.state)
    for _ in range(2):
        t.step()
    records = fail(t, [2])
    assert records[2].fallback is None
    assert t.state.lr_multipliers[2] == 1.25
    assert t.state.optimizers[2].param_groups[0]["lr"] == pytest.approx(cfg.lr * 1.25)


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_flatten_and_unflatten_round_trip_adam_state_after_any_number_of_steps(steps):
    t = make_trainer(tiny_config())
    for _ in range(steps):
        t.step()
    before = adam_and_weights(t, 3)
    assert len(before) == len(list(t.state.stages[3].parameters())) * (1 + 3 * (steps > 0))
    vector = flatten(t.state, 3)
    t.state.destroy(3)
    restore_copy(unflatten(vector, t.state, 3, 1.0), t.state, 3)
    after = adam_and_weights(t, 3)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before, strict=True))


def test_the_replica_ring_runs_over_stage_0_to_S():
    assert [predecessor(s, 4) for s in range(5)] == [4, 0, 1, 2, 3]


def test_redundant_restores_stage_0_from_stage_S_and_only_from_there():
    cfg = tiny_config()
    t = make_trainer(cfg, "redundant", ScriptedFailures())
    t.strategy.setup(t.state)
    t.step()
    stage0 = adam_and_weights(t, 0)
    records = fail(t, [0, 1])  # stage S = 4 holds stage 0's replica: exact; stage 1's holder (0) died
    assert records[0].rule == "replica" and records[0].source_stages == [4]
    assert all(torch.equal(a, b) for a, b in zip(adam_and_weights(t, 0), stage0, strict=True))
    assert records[1].fallback and "predecessor 0" in records[1].fallback

    t = make_trainer(cfg, "redundant", ScriptedFailures())
    t.strategy.setup(t.state)
    t.step()
    records = fail(t, [0, 4])  # stage 0's replica died with stage 4: no exact restore of stage 0 exists
    assert records[0].rule == "random" and "predecessor 4" in records[0].fallback
    assert records[4].rule == "replica" and records[4].source_stages == [3]


def test_ec_snapshot_records_how_stale_the_decoded_stage_is():
    t = make_trainer(tiny_config(snapshot_every=4), "ec_snapshot")
    t.strategy.setup(t.state)
    for _ in range(6):
        t.step()
    rec = fail(t, [3])[3].to_json()
    assert rec["rule"] == "ec_decode"
    assert rec["snapshot_effective_iteration"] == 4 and rec["stale_iterations"] == 2


def test_one_restores_the_lr_multiplier_the_stage_had_at_the_checkpoint(tmp_path):
    cfg = tiny_config(checkpoint_every=2, save_mode="memory", lr_scale=1.25)
    t = make_trainer(cfg, "one", ScriptedFailures(), checkpoint_dir=tmp_path)
    t.state.fresh_optimizer(2, 1.25)  # rebuilt before the checkpoint
    t.strategy.setup(t.state)
    for _ in range(2):
        t.step()
    t.strategy.begin_iteration(t.state, [])  # the checkpoint at effective iteration 2
    t.state.fresh_optimizer(2, 1.5)  # changed after it
    fail(t, [2])
    assert t.state.lr_multipliers[2] == 1.25
    assert t.state.optimizers[2].param_groups[0]["lr"] == pytest.approx(cfg.lr * 1.25)
