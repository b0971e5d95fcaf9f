"""One trainer iteration against an independent re-implementation of the paper's step (§4, §6):

    loss = Σ_mb CE(stages in stage_order(mb)) / mb_count ; backward ; ω_s = ‖∇_s‖ (before clipping) ;
    clip each stage to grad_clip (torch.nn.utils.clip_grad_norm_) ; Adam at lr × lr_multiplier[s]

The reference is written with plain torch calls on a deep copy of the stages, so a change to the order, the loss
scaling, the clipping, the ω bookkeeping or the per-stage learning rate in checkfree.sim.trainer shows up here.
"""

from __future__ import annotations

import copy

import pytest
import torch

from checkfree.pipeline import forward_loss, stage_order
from checkfree.sim.trainer import learning_rate
from checkfree.training_state import make_adam

from helpers import make_trainer, tiny_config

pytestmark = pytest.mark.timeout(60)


class Reference:
    """The stages, optimizers and LR multipliers of a trainer, copied, stepped with plain torch."""

    def __init__(self, trainer):
        self.cfg, self.swaps, self.batches = trainer.cfg, trainer.swaps, trainer.batches
        self.stages = copy.deepcopy(trainer.state.stages)
        self.multipliers = list(trainer.state.lr_multipliers)
        self.optimizers = [make_adam(s, self.cfg.lr) for s in self.stages]
        self.norms: list[float] = []
        self.grads: list[list[torch.Tensor]] = []

    def step(self, position: int) -> float:
        cfg = self.cfg
        for s, opt in enumerate(self.optimizers):
            opt.param_groups[0]["lr"] = learning_rate(cfg, position) * self.multipliers[s]
            opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in range(cfg.mb_count):
            batch = self.batches.batch(position * cfg.mb_count + mb)
            loss = forward_loss(self.stages, batch, stage_order(mb, cfg.n_stages, self.swaps))
            (loss / cfg.mb_count).backward()
            total += float(loss.detach()) / cfg.mb_count
        self.norms = [
            float(torch.nn.utils.clip_grad_norm_(s.parameters(), cfg.grad_clip)) for s in self.stages
        ]  # returns the norm before clipping
        self.grads = [[p.grad.clone() for p in s.parameters()] for s in self.stages]
        for opt in self.optimizers:
            opt.step()
        return total


def close(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    """Equal up to rounding: the reference clips with a float32 coefficient, the trainer with a Python float."""
    return torch.allclose(a, b, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("swaps", [False, True])
def test_an_iteration_is_the_papers_step(swaps):
    """ω is the norm before clipping, the step uses the clipped gradient, microbatch losses are averaged,
    odd microbatches run swapped, and a recovered stage steps at lr × lr_scale."""
    cfg = tiny_config(grad_clip=0.02, mb_count=3)  # clipping is active on every stage
    trainer = make_trainer(cfg, "no_failure", swaps=swaps)
    trainer.state.fresh_optimizer(2, cfg.lr_scale)  # as after a recovery of stage 2
    ref = Reference(trainer)
    for position in range(3):
        loss = trainer.step()
        assert loss == pytest.approx(ref.step(position), rel=1e-5)
        assert trainer.state.grad_norms == pytest.approx(ref.norms, rel=1e-5)
        assert all(n > 5 * cfg.grad_clip for n in ref.norms)  # so "after clipping" would differ
        for s, stage in enumerate(trainer.state.stages):
            assert all(
                close(p.grad, g, 1e-9) for p, g in zip(stage.parameters(), ref.grads[s], strict=True)
            ), s
            assert all(
                close(p, q, 1e-5) for p, q in zip(stage.parameters(), ref.stages[s].parameters(), strict=True)
            ), s
    lrs = [opt.param_groups[0]["lr"] for opt in trainer.state.optimizers]
    assert lrs == pytest.approx([cfg.lr, cfg.lr, cfg.lr * cfg.lr_scale, cfg.lr, cfg.lr])


def test_swapped_and_in_order_runs_differ():
    """The reference above would not see a trainer that ignores the swap flag if both orders gave the same
    result: they do not."""
    a, b = make_trainer(tiny_config(), swaps=True), make_trainer(tiny_config(), swaps=False)
    a.step(), b.step()
    assert not torch.equal(
        a.state.stages[1].layers[0].mlp.down_proj.weight, b.state.stages[1].layers[0].mlp.down_proj.weight
    )


def test_after_a_rollback_the_learning_rate_follows_the_training_position(tmp_path):
    """GPT's warm-up/cosine schedule is a function of the data position (effective iteration), which a
    checkpoint rollback moves back; the wall-clock iteration keeps growing."""
    from checkfree.telemetry.metrics import MetricsSink, read_metrics

    from helpers import ScriptedFailures

    cfg = tiny_config(
        architecture="GPT", warmup_iterations=4, max_iterations=8, checkpoint_every=3, save_mode="memory"
    )
    sink = MetricsSink(tmp_path / "m.jsonl")
    make_trainer(cfg, "checkpoint", ScriptedFailures({5: [2]}), sink=sink).train()
    sink.close()
    trains = [r for r in read_metrics(tmp_path / "m.jsonl") if r["kind"] == "train"]
    assert any(r["iteration"] != r["effective_iteration"] for r in trains)  # a rollback happened
    assert [r["lr"] for r in trains] == pytest.approx(
        [learning_rate(cfg, r["effective_iteration"]) for r in trains]
    )
