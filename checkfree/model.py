"""Pipeline stages cut from a Hugging Face ``LlamaForCausalLM`` or ``GPT2LMHeadModel``.

The model is F = E⁻¹ ∘ (I+f_L) ∘ … ∘ (I+f_1) ∘ E (paper §3). Stage 0 holds E (token embedding, plus learned
positions for GPT) and E⁻¹ (final norm + untied LM head); transformer stages 1..S each hold ``n_layers_per_stage``
consecutive blocks. Every transformer stage has the same parameter names and shapes, which is what lets the
recovery rules average neighbours tensor by tensor.

This module knows nothing of ranks, failures or networks. Running the stages in order gives bit-identical logits
and gradients to the unsplit model (tests/test_model.py).

A stage's forward never waits for the device: the causal mask is built from shapes only, so SDPA takes its
``is_causal`` path (the flash kernel on CUDA), eagerly and under ``torch.compile``. ``Module.compile`` compiles
stage 0's embedding and head too (:meth:`EmbeddingStage.compile`). A transformer stage can recompute its blocks
in the backward pass instead of keeping their activations (:attr:`TransformerStage.activation_checkpointing`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import create_causal_mask

from checkfree.config import Config

# Parameter-name suffixes of each block's MLP output projection (used by the "zero" recovery rule).
MLP_OUT_SUFFIXES = {"LLaMa": ("mlp.down_proj.weight",), "GPT": ("mlp.c_proj.weight", "mlp.c_proj.bias")}


def hf_config(cfg: Config, vocab_size: int, eos_token_id: int | None = None) -> LlamaConfig | GPT2Config:
    """The transformers config of the whole (unsplit) model described by ``cfg`` (paper §6 architecture).

    ``eos_token_id`` becomes the BOS and EOS id (generation stops at it) but never ``pad_token_id``: transformers
    builds the token embedding with ``padding_idx = pad_token_id``, which zeroes that row and gives it no gradient,
    and the end-of-text token separates every packed document, so it must learn like any other token. Training
    never pads (fixed-length packed windows); export sets the generation pad id to EOS separately.
    """
    special = {"bos_token_id": eos_token_id, "eos_token_id": eos_token_id, "pad_token_id": None}
    if cfg.architecture == "LLaMa":
        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=cfg.dmodel,
            intermediate_size=4 * cfg.dmodel,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_heads,
            max_position_embeddings=cfg.seq_l,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            initializer_range=cfg.init_std,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
            attn_implementation="sdpa",
            use_cache=False,
            **special,
        )
    return GPT2Config(
        vocab_size=vocab_size,
        n_embd=cfg.dmodel,
        n_layer=cfg.n_layers,
        n_head=cfg.num_heads,
        n_positions=cfg.seq_l,
        n_inner=4 * cfg.dmodel,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=cfg.init_std,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
        use_cache=False,
        **special,
    )


def build_hf_model(
    cfg: Config, vocab_size: int, seed: int, eos_token_id: int | None = None
) -> LlamaForCausalLM | GPT2LMHeadModel:
    """The unsplit transformers model, initialised N(0, init_std) from a generator seeded with ``seed``."""
    rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)  # HF init draws from the global generator; restore it afterwards
        hf = hf_config(cfg, vocab_size, eos_token_id)
        model = LlamaForCausalLM(hf) if cfg.architecture == "LLaMa" else GPT2LMHeadModel(hf)
    finally:
        torch.random.set_rng_state(rng_state)
    return model


class EmbeddingStage(nn.Module):
    """Stage 0: E (embedding) at the start of the pipeline, E⁻¹ (final norm + LM head) at its end."""

    def __init__(
        self,
        architecture: str,
        embed: nn.Module,
        norm: nn.Module,
        lm_head: nn.Module,
        positions: nn.Module | None = None,
    ):
        super().__init__()
        self.architecture = architecture
        self.embed_tokens = embed
        self.positions = positions
        self.norm = norm
        self.lm_head = lm_head
        # torch.compile'd _embed/_head once compile() ran; None: eager. Plain attributes, not submodules, so
        # parameter names and the state dict stay those of the eager stage.
        self._compiled_embed: Any = None
        self._compiled_head: Any = None
        self._compiled_norm: Any = None

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) int64 → hidden states (B, T, d)."""
        return (self._compiled_embed or EmbeddingStage._embed)(self, input_ids)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """hidden states (B, T, d) → logits (B, T, V)."""
        return (self._compiled_head or EmbeddingStage._head)(self, h)

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        """hidden states (B, T, d) → normalised (B, T, d): E⁻¹ without its LM head, which the fused loss applies
        (checkfree.loss.head_loss)."""
        return (self._compiled_norm or EmbeddingStage._norm)(self, h)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.positions is not None:
            h = h + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        return h

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    def _norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``torch.compile`` E and E⁻¹ with ``args``/``kwargs`` (e.g. ``backend="eager"``), in place.

        ``nn.Module.compile`` compiles ``forward`` only, and stage 0 has none: it is called through
        :meth:`embed` and :meth:`head`. The compiled functions are unbound (the stage is their first argument),
        so a ``copy.deepcopy`` of the stage runs on its own weights; parameter names and the state dict are
        unchanged, so recovery and checkpoints work as on an eager stage.
        """
        self._compiled_embed = torch.compile(EmbeddingStage._embed, *args, **kwargs)
        self._compiled_head = torch.compile(EmbeddingStage._head, *args, **kwargs)
        self._compiled_norm = torch.compile(EmbeddingStage._norm, *args, **kwargs)


class TransformerStage(nn.Module):
    """Stages 1..S: a slice of consecutive transformer blocks; (B, T, d) → (B, T, d).

    ``activation_checkpointing`` (default False; the simulator's ``--activation-checkpointing``): under autograd
    each block runs through ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``, which keeps only the
    block's input and recomputes its activations in the backward pass (Chen et al. 2016, *Training Deep Nets with
    Sublinear Memory Cost*): less activation memory for one more forward per block. The blocks have no dropout,
    so the recomputation is exact and the gradients equal those without it.
    """

    def __init__(
        self,
        architecture: str,
        hf: LlamaConfig | GPT2Config,
        layers: list[nn.Module],
        rotary: nn.Module | None = None,
    ):
        super().__init__()
        self.architecture = architecture
        self.hf_config = hf
        self.layers = nn.ModuleList(layers)
        self.rotary_emb = rotary  # parameter-free (inv_freq is a non-persistent buffer)
        self.activation_checkpointing = False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (B, T, d) → (B, T, d); causal self-attention over the T positions 0..T−1."""
        T = h.shape[1]
        pos = torch.arange(T, device=h.device).unsqueeze(0)  # (1, T)
        # Always ask for the mask: eager attention with attention_mask=None would be non-causal (STACK.md).
        # No position_ids: with them transformers looks for packed sequences, reading a device tensor (one host
        # sync per stage and microbatch) and, under torch.compile, materialising a (B, 1, T, T) mask that keeps
        # SDPA off its flash kernel. Without them the mask depends on shapes only: None for sdpa (the model is
        # built with attn_implementation="sdpa"), which then attends with is_causal=True (tests/test_model.py).
        mask = create_causal_mask(
            config=self.hf_config, inputs_embeds=h, attention_mask=None, past_key_values=None
        )
        # by keyword: GPT2Block's 2nd positional argument is the KV cache
        kwargs: dict[str, Any] = {"attention_mask": mask}
        if self.architecture == "LLaMa":
            kwargs.update(position_embeddings=self.rotary_emb(h, position_ids=pos), position_ids=pos)
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                h = checkpoint(layer, h, use_reentrant=False, **kwargs)
            else:
                h = layer(h, **kwargs)
            h = h[0] if isinstance(h, tuple) else h
        return h


def split_model(model: LlamaForCausalLM | GPT2LMHeadModel, cfg: Config) -> list[nn.Module]:
    """Cut an unsplit model into [stage 0, stage 1, …, stage S]; the stages share its parameter tensors."""
    L = cfg.n_layers_per_stage
    if cfg.architecture == "LLaMa":
        body, blocks = model.model, list(model.model.layers)
        stage0 = EmbeddingStage("LLaMa", body.embed_tokens, body.norm, model.lm_head)
    else:
        body, blocks = model.transformer, list(model.transformer.h)
        stage0 = EmbeddingStage("GPT", body.wte, body.ln_f, model.lm_head, positions=body.wpe)
    if len(blocks) != cfg.n_layers:
        raise ValueError(
            f"the model has {len(blocks)} blocks; expected n_stages × n_layers_per_stage = {cfg.n_layers}."
        )
    stages: list[nn.Module] = [stage0]
    for s in range(cfg.n_stages):
        rotary = None
        if cfg.architecture == "LLaMa":
            rotary = type(body.rotary_emb)(config=model.config)
        stages.append(TransformerStage(cfg.architecture, model.config, blocks[s * L : (s + 1) * L], rotary))
    return stages


def build_stages(cfg: Config, vocab_size: int, seed: int) -> list[nn.Module]:
    """[stage 0, stage 1, …, stage S] of a freshly initialised model (see :func:`build_hf_model`)."""
    return split_model(build_hf_model(cfg, vocab_size, seed), cfg)


def assemble_hf_model(
    stages: list[nn.Module], cfg: Config, vocab_size: int
) -> LlamaForCausalLM | GPT2LMHeadModel:
    """An unsplit transformers model holding copies of the stages' weights (for export and tests)."""
    model = build_hf_model(cfg, vocab_size, seed=0)
    target = split_model(model, cfg)
    with torch.no_grad():
        for dst, src in zip(target, stages, strict=True):
            dst.load_state_dict(src.state_dict())
    return model


def stage_parameter_counts(stages: list[nn.Module]) -> list[int]:
    """Number of parameters of each stage."""
    return [sum(p.numel() for p in s.parameters()) for s in stages]


def global_layer_index(stage: int, local: int, n_layers_per_stage: int) -> int:
    """Index in the unsplit model of block ``local`` of transformer stage ``stage`` (1-based stages)."""
    return (stage - 1) * n_layers_per_stage + local
