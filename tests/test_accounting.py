"""Per-failure recovery accounting: known weights give known distances, the spike is measured on the probe batch,
the lost copy is out of every strategy's reach, and measuring changes nothing about training."""

from __future__ import annotations

import pytest
import torch

from checkfree.accounting import weight_distance
from checkfree.pipeline import forward_loss
from checkfree.recovery.neighbours import Copy

from helpers import ScriptedFailures, make_trainer, tiny_config

pytestmark = pytest.mark.timeout(120)


def capture_sink(t):
    records = []
    t.ctx.sink.write = lambda kind, **kw: records.append({"kind": kind, **kw})
    return records


def test_known_weights_give_known_distances_and_the_spike_is_the_probe_loss_difference():
    t = make_trainer(tiny_config(), "copy", ScriptedFailures({2: [2]}))
    records = capture_sink(t)
    t.step(), t.step()
    lost = t.state.stage_state(2)
    t.state.load_stage(1, {k: 2 * v for k, v in lost.items()})  # copy will rebuild stage 2 as 2 × W_lost
    with torch.no_grad():
        before = float(forward_loss(t.state.stages, t.val_batches[0], range(1, 5)))
    t.step()
    (rec,) = [r for r in records if r["kind"] == "recovery"]
    assert rec["weight_rel_l2"] == pytest.approx(1.0) and rec["weight_cosine"] == pytest.approx(1.0)
    assert rec["probe_loss_before"] == pytest.approx(before)
    rebuilt = t.state.stage_state(
        2
    )  # (stepped once since: recompute the after-loss from a fresh copy instead)
    assert rec["loss_spike"] == pytest.approx(rec["probe_loss_after"] - rec["probe_loss_before"])
    assert rec["probe_loss_after"] != pytest.approx(before) and rec["accounting_seconds"] >= 0
    assert rebuilt.keys() == lost.keys()


def test_weight_distance_by_hand():
    lost = {"w": torch.tensor([3.0, 4.0]), "step": torch.tensor([1])}
    rel, cos = weight_distance(lost, {"w": torch.tensor([3.0, 0.0]), "step": torch.tensor([7])})
    assert rel == pytest.approx(4 / 5) and cos == pytest.approx(9 / 15)  # integer tensors are not weights
    with pytest.raises(ValueError):
        weight_distance({"w": torch.zeros(2)}, {"w": torch.ones(2)})


class Spy(Copy):
    """A strategy that searches everything it can reach for the lost weights."""

    name = "copy"

    def recover(self, state, failed):
        seen, stack, found = set(), [state, self.ctx, self], []
        while stack:
            obj = stack.pop()
            if id(obj) in seen or isinstance(obj, str | bytes | int | float | type(None)):
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                found.append(obj)
            elif isinstance(obj, dict):
                stack += list(obj.values())
            elif isinstance(obj, list | tuple | set):
                stack += list(obj)
            elif isinstance(obj, torch.nn.Module):
                stack += list(obj.state_dict().values())
            elif hasattr(obj, "__dict__"):
                stack += list(vars(obj).values())
        self.reachable = found
        return super().recover(state, failed)


def test_a_strategy_cannot_reach_the_lost_weights():
    cfg = tiny_config()
    t = make_trainer(cfg, "copy", ScriptedFailures({1: [3]}))
    spy = Spy(cfg)
    spy.bind(t.ctx)
    t.strategy = spy
    t.step()
    lost = t.state.stage_state(3)
    t.step()
    big = [x for x in spy.reachable if x.is_floating_point() and x.numel() > 1]
    for key, w in lost.items():
        if w.numel() > 1:
            assert not any(x.shape == w.shape and torch.equal(x, w) for x in big), key


def test_accounting_changes_nothing_about_training_and_can_be_turned_off():
    script = {2: [1], 4: [2, 3]}
    on = make_trainer(tiny_config(), "checkfree", ScriptedFailures(script))
    off = make_trainer(tiny_config(), "checkfree", ScriptedFailures(script))
    off.accounting = None
    records = capture_sink(off)
    for _ in range(6):
        on.step(), off.step()
    for a, b in zip(on.state.stages, off.state.stages, strict=True):
        assert all(
            torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
        )
    assert not any("loss_spike" in r for r in records if r["kind"] == "recovery")
