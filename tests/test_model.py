"""Stages cut from transformers models compute exactly what the unsplit model computes."""

import pytest
import torch
import torch.nn.functional as F

from checkfree.model import assemble_hf_model, build_hf_model, split_model, stage_parameter_counts
from checkfree.pipeline import forward_loss
from checkfree.telemetry.metrics import MetricsSink

from helpers import tiny_config


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_staged_forward_and_backward_equal_unsplit_model(arch):
    cfg = tiny_config(architecture=arch, n_layers_per_stage=2)
    model = build_hf_model(cfg, 300, seed=1)
    stages = split_model(model, cfg)
    batch = torch.randint(0, 300, (3, cfg.seq_l + 1), generator=torch.Generator().manual_seed(0))

    logits = model(input_ids=batch[:, :-1]).logits
    ref_loss = F.cross_entropy(logits.reshape(-1, 300), batch[:, 1:].reshape(-1))
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    loss = forward_loss(stages, batch, range(1, cfg.n_stages + 1))
    loss.backward()
    assert torch.equal(loss, ref_loss)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, ref_grads[n]), n


def test_attention_is_causal():
    cfg = tiny_config()
    stages = split_model(build_hf_model(cfg, 300, seed=0), cfg)
    batch = torch.randint(0, 300, (1, cfg.seq_l + 1))
    h = stages[0].embed(batch[:, :-1])
    out = stages[1](h)
    changed = h.clone()
    changed[:, -1] += 1.0  # a change at the last position must not reach earlier positions
    out2 = stages[1](changed)
    assert torch.equal(out[:, :-1], out2[:, :-1])
    assert not torch.equal(out[:, -1], out2[:, -1])


def test_transformer_stages_share_names_and_shapes():
    cfg = tiny_config(n_stages=5)
    stages = split_model(build_hf_model(cfg, 300, seed=0), cfg)
    shapes = [{k: v.shape for k, v in s.state_dict().items()} for s in stages[1:]]
    assert all(s == shapes[0] for s in shapes)
    counts = stage_parameter_counts(stages)
    assert len(counts) == 6 and len(set(counts[1:])) == 1


def test_assemble_round_trips_weights():
    cfg = tiny_config(architecture="GPT")
    stages = split_model(build_hf_model(cfg, 300, seed=3), cfg)
    model = assemble_hf_model(stages, cfg, 300)
    batch = torch.randint(0, 300, (2, cfg.seq_l + 1))
    assert torch.equal(
        model(input_ids=batch[:, :-1]).logits,
        stages[0].head(stages[4](stages[3](stages[2](stages[1](stages[0].embed(batch[:, :-1])))))),
    )


def test_init_does_not_touch_global_rng():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    build_hf_model(tiny_config(), 300, seed=9)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_end_of_text_embedding_learns_like_any_other_token(arch):
    """EOS separates every packed document: its embedding row starts random and moves after one step (it
    used to be the padding row, zero with no gradient, for the whole run)."""
    from checkfree.recovery.registry import make_strategy
    from checkfree.sim.trainer import RunContext, Trainer

    from helpers import VOCAB, RandomBatches, ScriptedFailures

    eos = 7
    cfg = tiny_config(architecture=arch)
    model = build_hf_model(cfg, VOCAB, seed=0, eos_token_id=eos)
    assert model.config.eos_token_id == eos  # generation still stops at EOS
    stages = split_model(model, cfg)
    table = stages[0].embed_tokens.weight
    before = table.detach().clone()
    assert before[eos].abs().sum() > 0  # initialised like every other row

    class WithEos(RandomBatches):
        def batch(self, step):
            b = super().batch(step)
            b[:, ::5] = eos  # documents packed back to back
            return b

    trainer = Trainer(
        cfg,
        stages,
        WithEos(cfg),
        [],
        make_strategy("no_failure", cfg, False),
        ScriptedFailures(),
        RunContext(sink=MetricsSink(None)),
        swaps=False,
    )
    trainer.step()
    moved = (table.detach() - before).abs().sum(dim=1)  # (V,)
    assert moved[eos] > 0
    assert moved[eos] >= moved[[t for t in range(VOCAB) if t != eos]].median()  # as much as a seen token
