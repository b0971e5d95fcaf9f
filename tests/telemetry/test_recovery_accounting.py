"""Per-failure recovery accounting: known weights give known distances, the probe losses are the model's loss on
the probe batch before and after, the lost weights are out of every strategy's reach, and it can be turned off."""

from __future__ import annotations

import math

import pytest
import torch

from checkfree.pipeline import forward_loss
from checkfree.recovery.neighbours import Copy
from checkfree.telemetry.metrics import MetricsSink, read_metrics
from checkfree.telemetry.recovery_accounting import weight_distance

from helpers import ScriptedFailures, make_trainer, tiny_config

pytestmark = pytest.mark.timeout(60)


def fill(trainer, values: dict[int, float]) -> None:
    """Set every parameter of each given stage to one constant."""
    with torch.no_grad():
        for s, v in values.items():
            for p in trainer.state.stages[s].parameters():
                p.fill_(v)


def probe(trainer) -> float:
    with torch.no_grad():
        return float(forward_loss(trainer.state.stages, trainer.val_batches[0], range(1, 5)))


def recovery_records(tmp_path, setting, values, failed=(2,), **kw):
    sink = MetricsSink(tmp_path / f"{setting}.jsonl")
    t = make_trainer(tiny_config(), setting, ScriptedFailures({0: list(failed)}), sink=sink, **kw)
    fill(t, values)
    before = probe(t)
    t.strategy.setup(t.state)
    t.lose_stages(t.failures.draw(0))
    after = probe(t)
    sink.close()
    recs = [r for r in read_metrics(tmp_path / f"{setting}.jsonl") if r["kind"] == "recovery"]
    return recs, before, after


@pytest.mark.parametrize(
    "setting, values, rel_l2, cosine",
    [
        # lost stage 2 = 1 everywhere; average of 3 and −1 = 1: nothing lost
        ("average", {1: 3.0, 2: 1.0, 3: -1.0}, 0.0, 1.0),
        # copy of stage 1 = 3: ‖3 − 1‖ / ‖1‖ = 2, same direction
        ("copy", {1: 3.0, 2: 1.0, 3: -1.0}, 2.0, 1.0),
        # copy of stage 1 = −2: ‖−2 − 1‖ / ‖1‖ = 3, opposite direction
        ("copy", {1: -2.0, 2: 1.0, 3: 5.0}, 3.0, -1.0),
    ],
)
def test_known_weights_give_known_distances_and_probe_losses(tmp_path, setting, values, rel_l2, cosine):
    (rec,), before, after = recovery_records(tmp_path, setting, values)
    assert rec["stage"] == 2
    assert rec["weight_rel_l2"] == pytest.approx(rel_l2, abs=1e-12)
    assert rec["weight_cosine"] == pytest.approx(cosine, abs=1e-12)
    assert rec["probe_loss_before"] == pytest.approx(before, rel=1e-6)
    assert rec["probe_loss_after"] == pytest.approx(after, rel=1e-6)
    assert rec["loss_spike"] == pytest.approx(after - before, abs=1e-6)
    assert rec["accounting_seconds"] >= 0
    if rel_l2 == 0:
        assert rec["loss_spike"] == 0.0  # the exact weights came back: the same probe loss, bit for bit


def test_weight_distance_on_orthogonal_and_mixed_tensors():
    lost = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([0.0, 0.0]), "step": torch.tensor([3])}
    rebuilt = {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0, 0.0]), "step": torch.tensor([9])}
    rel, cos = weight_distance(rebuilt, lost)  # integer tensors do not count
    assert rel == pytest.approx(math.sqrt(2)) and cos == 0.0
    assert weight_distance(lost, {k: torch.zeros_like(v) for k, v in lost.items()}) == (None, None)
    with pytest.raises(ValueError, match="differ in keys"):
        weight_distance({"a": lost["a"]}, lost)


def test_every_stage_of_a_multiple_failure_gets_its_own_distance(tmp_path):
    recs, before, after = recovery_records(tmp_path, "copy", {1: 3.0, 2: 1.0, 3: 2.0}, failed=(2, 3))
    by_stage = {r["stage"]: r for r in recs}
    # both rebuilt as copies of stage 1 (= 3): stage 2 lost 1 → 2.0, stage 3 lost 2 → 0.5
    assert [by_stage[2]["weight_rel_l2"], by_stage[3]["weight_rel_l2"]] == pytest.approx([2.0, 0.5])
    assert [r["probe_loss_before"] for r in recs] == pytest.approx([before, before])
    assert [r["probe_loss_after"] for r in recs] == pytest.approx([after, after])


def reachable_tensors(*roots) -> list[torch.Tensor]:
    """Every tensor reachable from ``roots`` through instance attributes, containers and optimizer state."""
    seen, stack, out = set(), list(roots), []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, bool)) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append(obj)
            continue
        if isinstance(obj, dict):
            stack += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += list(obj)
        if hasattr(obj, "__dict__") and not callable(obj):
            stack += list(vars(obj).values())
        elif isinstance(obj, torch.nn.Module):
            stack += list(vars(obj).values())
    return out


class Spy(Copy):
    """A copy strategy that looks, before rebuilding, for any copy of the lost weights it could read."""

    name = "spy"
    lost_weights: dict[str, torch.Tensor] = {}  # a class attribute: not among what the walk can reach

    def recover(self, state, failed):
        reachable = reachable_tensors(state, self, self.ctx)
        self.found = [
            name
            for name, w in self.lost_weights.items()
            if any(t.shape == w.shape and t.dtype == w.dtype and torch.equal(t, w) for t in reachable)
        ]
        self.reached = len(reachable)
        return super().recover(state, failed)


@pytest.mark.parametrize("leak", [False, True])
def test_a_strategy_cannot_reach_the_lost_weights(tmp_path, leak):
    cfg = tiny_config()
    sink = MetricsSink(tmp_path / "m.jsonl")
    t = make_trainer(cfg, "copy", ScriptedFailures({1: [2]}), sink=sink)
    spy = Spy(cfg, seed=0)
    spy.bind(t.ctx)
    t.strategy = spy
    t.strategy.setup(t.state)
    t.step()
    Spy.lost_weights = {k: v.detach().clone() for k, v in t.state.stages[2].state_dict().items()}
    if leak:  # the control: a copy parked where a strategy can see it is found
        t.state.leaked = {k: v.clone() for k, v in Spy.lost_weights.items()}
    t.step()
    sink.close()
    assert spy.reached > 50  # the walk saw the stages, optimizers and context
    assert bool(spy.found) == leak
    (rec,) = [r for r in read_metrics(tmp_path / "m.jsonl") if r["kind"] == "recovery"]
    assert rec["weight_rel_l2"] > 0  # the trainer did keep the lost weights for the measurement


def test_no_recovery_accounting_leaves_the_records_as_they_were(tmp_path):
    from checkfree.cli import build_parser

    args = build_parser().parse_args(
        ["simulate", "--setting", "copy", "--config", "x", "--no-recovery-accounting"]
    )
    assert args.recovery_accounting is False
    sink = MetricsSink(tmp_path / "m.jsonl")
    t = make_trainer(tiny_config(), "copy", ScriptedFailures({1: [2]}), sink=sink, recovery_accounting=False)
    t.strategy.setup(t.state)
    t.step(), t.step()
    sink.close()
    (rec,) = [r for r in read_metrics(tmp_path / "m.jsonl") if r["kind"] == "recovery"]
    assert not {"weight_rel_l2", "weight_cosine", "probe_loss_before", "loss_spike"} & set(rec)


def test_measuring_changes_nothing_about_training():
    """The probe forwards use no randomness and the copy is dropped: a run trains bit-identically without it."""
    script = {2: [1], 4: [2, 3]}
    on = make_trainer(tiny_config(), "checkfree", ScriptedFailures(script))
    off = make_trainer(tiny_config(), "checkfree", ScriptedFailures(script), recovery_accounting=False)
    for _ in range(6):
        on.step(), off.step()
    for a, b in zip(on.state.stages, off.state.stages, strict=True):
        assert all(
            torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
        )
