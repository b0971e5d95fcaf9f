"""The head and loss (checkfree/loss.py): which path runs where, and that the fused path hands Liger's loss the
final norm's output, the head's weight and the labels, and nothing else.

Liger-Kernel runs on CUDA only and is not installed here (CI has neither): its absence is the real case on a CPU,
and a fake module put in ``sys.modules`` stands in for it. The fake computes the same cross-entropy with torch
and records its calls, so the dispatch is tested, and the numbers of the fused path against the plain one.
"""

from __future__ import annotations

import pytest
import torch

from checkfree import loss as L
from checkfree.model import build_stages
from checkfree.pipeline import forward_loss

from helpers import VOCAB, make_trainer, tiny_config
from helpers.liger import FakeLiger, install_fake_liger, remove_liger


@pytest.fixture
def fake_liger(monkeypatch) -> FakeLiger:
    return install_fake_liger(monkeypatch)


@pytest.fixture
def no_liger(monkeypatch) -> None:
    remove_liger(monkeypatch)


# ------------------------------------------------------------------------------------------------ which path


def test_auto_is_plain_on_a_cpu_even_with_liger(fake_liger):
    path = L.resolve_loss_path("auto", "cpu")
    assert not path.fused
    assert path.line == "loss: plain cross-entropy over fp32 logits (no CUDA)"


def test_auto_on_cuda_is_fused_where_liger_imports(fake_liger):
    path = L.resolve_loss_path("auto", "cuda")
    assert path.fused
    assert path.line == "loss: liger fused linear cross-entropy (CUDA, liger-kernel 0.0-fake)"


def test_auto_on_cuda_without_liger_is_plain_and_says_why(no_liger):
    path = L.resolve_loss_path("auto", "cuda")
    assert not path.fused
    assert path.line == "loss: plain cross-entropy over fp32 logits (liger-kernel not installed)"


def test_liger_installed_without_triton_is_not_importable(monkeypatch):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setattr(L.importlib, "import_module", import_module)
    path = L.resolve_loss_path("auto", "cuda")
    assert not path.fused and "liger-kernel not importable: No module named 'triton'" in path.reason


def test_off_is_plain_everywhere(fake_liger):
    for device in ("cuda", "cpu"):
        path = L.resolve_loss_path("off", device)
        assert not path.fused and path.reason == "--fused-loss off"


def test_on_without_cuda_is_refused_not_a_silent_fallback(fake_liger):
    with pytest.raises(ValueError, match=r"^--fused-loss on needs CUDA, but this run computes on the cpu"):
        L.resolve_loss_path("on", "cpu")


def test_on_without_liger_is_refused(no_liger):
    with pytest.raises(
        ValueError, match=r"^fused_loss on needs Liger-Kernel, but liger-kernel not installed"
    ):
        L.resolve_loss_path("on", "cuda", option="fused_loss")


def test_on_with_cuda_and_liger_is_fused(fake_liger):
    assert L.resolve_loss_path("on", "cuda").fused


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match=r"^--fused-loss is 'yes'; expected one of auto, on, off\.$"):
        L.resolve_loss_path("yes", "cpu")


# ------------------------------------------------------------------------------------------------ the loss


@pytest.mark.parametrize("architecture", ["LLaMa", "GPT"])
def test_the_fused_path_gets_the_normalised_input_the_head_weight_and_the_labels(fake_liger, architecture):
    cfg = tiny_config(architecture=architecture)
    stage0 = build_stages(cfg, VOCAB, seed=0)[0]
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, cfg.seq_l, cfg.dmodel, generator=g)  # (B, T, d)
    labels = torch.randint(0, VOCAB, (2, cfg.seq_l), generator=g)
    plain = L.head_loss(stage0, h, labels, fused=False)
    assert fake_liger.calls == []
    fused = L.head_loss(stage0, h, labels, fused=True)
    (call,) = fake_liger.calls
    assert call["weight"] is stage0.lm_head.weight and call["bias"] is stage0.lm_head.bias
    assert torch.equal(call["input"], stage0.norm(h).reshape(-1, cfg.dmodel))  # the final norm first
    assert torch.equal(call["target"], labels.reshape(-1))
    # the fake computes what liger computes: the same token mean as the plain path
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)


def test_the_fused_path_trains_the_head_and_the_norm(fake_liger):
    cfg = tiny_config()
    stage0 = build_stages(cfg, VOCAB, seed=0)[0]
    h = torch.randn(2, cfg.seq_l, cfg.dmodel, requires_grad=True)
    labels = torch.randint(0, VOCAB, (2, cfg.seq_l))
    L.head_loss(stage0, h, labels, fused=True).backward()
    grads = {n: p.grad for n, p in stage0.named_parameters()}
    assert grads["lm_head.weight"] is not None and grads["norm.weight"] is not None and h.grad is not None


def test_forward_loss_dispatches_on_fused(fake_liger):
    cfg = tiny_config()
    stages = build_stages(cfg, VOCAB, seed=0)
    batch = torch.randint(0, VOCAB, (2, cfg.seq_l + 1))
    order = range(1, cfg.n_stages + 1)
    plain = forward_loss(stages, batch, order)
    assert fake_liger.calls == []
    fused = forward_loss(stages, batch, order, fused=True)
    assert len(fake_liger.calls) == 1
    torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)


def test_the_trainer_trains_on_the_fused_loss_and_evaluates_on_the_plain_one(fake_liger):
    cfg = tiny_config()
    trainer = make_trainer(cfg)
    trainer.ctx.fused_loss = True
    trainer.strategy.setup(trainer.state)
    trainer.step()
    assert len(fake_liger.calls) == cfg.mb_count  # one per microbatch
    trainer.evaluate()
    assert len(fake_liger.calls) == cfg.mb_count  # validation: the plain path, as before


def test_the_trainer_defaults_to_the_plain_loss(fake_liger):
    trainer = make_trainer(tiny_config())
    trainer.strategy.setup(trainer.state)
    trainer.step()
    assert fake_liger.calls == []
