"""Stages cut from transformers models compute exactly what the unsplit model computes."""

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

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


HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "equal", "allclose")


class HostReads(TorchFunctionMode):
    """Records every read of a tensor's value by the host (a device → host sync on CUDA)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
@pytest.mark.parametrize("recompute", [False, True])
def test_a_transformer_stage_never_reads_a_tensor_value_on_the_host(arch, recompute):
    """transformers' packed-sequence check (position_ids given) did `.all()` → bool: a sync per stage and
    microbatch."""
    cfg = tiny_config(architecture=arch)
    stages = split_model(build_hf_model(cfg, 300, seed=0), cfg)
    stages[1].activation_checkpointing = recompute
    h = torch.randn(2, cfg.seq_l, cfg.dmodel, requires_grad=True)
    with HostReads() as reads:
        stages[1](h).sum().backward()
    assert reads.calls == []


def _compiled_graphs(module, call):
    """The FX graphs torch.compile (backend "eager") makes of ``module`` while ``call()`` runs."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    module.compile(backend=backend)
    out = call()
    return graphs, out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_compiled_stage_attends_with_sdpa_is_causal_and_no_materialised_mask(arch):
    """Under torch.compile the mask must stay None so SDPA can take its flash kernel (is_causal=True)."""
    cfg = tiny_config(architecture=arch)
    stages = split_model(build_hf_model(cfg, 300, seed=0), cfg)
    h = torch.randn(2, cfg.seq_l, cfg.dmodel)
    eager = stages[1](h)
    graphs, out = _compiled_graphs(stages[1], lambda: stages[1](h))
    sdpa = [
        n
        for g in graphs
        for n in g.graph.nodes
        if n.op == "call_function" and "scaled_dot_product_attention" in str(n.target)
    ]
    assert len(sdpa) == cfg.n_layers_per_stage
    for node in sdpa:
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        assert mask is None and node.kwargs.get("is_causal") is True, node.format_node()
    assert torch.equal(out, eager)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_compile_compiles_stage0_embedding_and_head_and_keeps_its_state_dict(arch):
    """nn.Module.compile compiles forward only; stage 0 is called through embed and head, so it compiles them."""
    import copy

    cfg = tiny_config(architecture=arch)
    stages = split_model(build_hf_model(cfg, 300, seed=0), cfg)
    stage0 = stages[0]
    ids = torch.randint(0, 300, (2, cfg.seq_l), generator=torch.Generator().manual_seed(0))
    keys = list(stage0.state_dict())
    eager = stage0.head(stage0.embed(ids))
    graphs, out = _compiled_graphs(stage0, lambda: stage0.head(stage0.embed(ids)))
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert len(graphs) == 2  # one graph for E, one for E⁻¹: every call went through dynamo
    assert any("embedding" in t for t in targets) and any("linear" in t for t in targets)
    assert torch.equal(out, eager)
    assert list(stage0.state_dict()) == keys  # recovery and checkpoints see the same names
    stage0.load_state_dict(stage0.state_dict())
    twin = copy.deepcopy(stage0)  # a replica (the redundant strategy) computes with its own weights
    with torch.no_grad():
        twin.lm_head.weight.zero_()
    assert torch.count_nonzero(twin.head(twin.embed(ids))) == 0
    assert torch.equal(stage0.head(stage0.embed(ids)), eager)


def _saved_bytes(fn) -> int:
    """Bytes of the tensors autograd saves for the backward pass while ``fn()`` runs (outside checkpoints)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return total, out


@pytest.mark.parametrize("arch", ["LLaMa", "GPT"])
def test_activation_checkpointing_gives_the_same_gradients_and_saves_less(arch):
    cfg = tiny_config(architecture=arch, n_layers_per_stage=2)
    batch = torch.randint(0, 300, (3, cfg.seq_l + 1), generator=torch.Generator().manual_seed(0))
    order = range(1, cfg.n_stages + 1)
    grads, saved = {}, {}
    for recompute in (False, True):
        stages = split_model(build_hf_model(cfg, 300, seed=1), cfg)
        for s in stages[1:]:
            s.activation_checkpointing = recompute
        saved[recompute], loss = _saved_bytes(functools.partial(forward_loss, stages, batch, order))
        loss.backward()
        grads[recompute] = [p.grad for s in stages for p in s.parameters()]
    for with_, without in zip(grads[True], grads[False], strict=True):
        assert torch.allclose(with_, without, rtol=0, atol=1e-6)
    # without: every block's activations. With: what lies outside the blocks (embedding, head, loss), plus the
    # input (B, T, d) float32 of each block, which the checkpoint keeps itself (the hook does not see it).
    kept_inputs = cfg.n_layers * batch.shape[0] * cfg.seq_l * cfg.dmodel * 4
    assert saved[True] + kept_inputs < saved[False] / 3, saved


def test_the_trainer_turns_activation_checkpointing_on_for_transformer_stages_only():
    from checkfree.recovery.registry import make_strategy
    from checkfree.sim.trainer import RunContext, Trainer

    from helpers import VOCAB, RandomBatches, ScriptedFailures

    cfg = tiny_config()
    results = {}
    for recompute in (False, True):
        trainer = Trainer(
            cfg,
            split_model(build_hf_model(cfg, VOCAB, seed=0), cfg),
            RandomBatches(cfg),
            [],
            make_strategy("checkfree", cfg, False),
            ScriptedFailures({1: [2]}),
            RunContext(sink=MetricsSink(None), activation_checkpointing=recompute),
            swaps=False,
        )
        assert [getattr(s, "activation_checkpointing", None) for s in trainer.state.stages] == [None] + [
            recompute
        ] * cfg.n_stages
        losses = [trainer.step() for _ in range(2)]
        results[recompute] = (losses, list(trainer.state.grad_norms))
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-6, abs=1e-6)
    assert results[True][1] == pytest.approx(results[False][1], rel=1e-5, abs=1e-6)
