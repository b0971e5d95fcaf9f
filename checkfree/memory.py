"""Memory per simulator rank and per swarm node, from the config's shapes alone (nothing is allocated).

A run that cannot fit is refused before anything is built (``--set dmodel=1000000000`` in milliseconds, not
after trying to allocate terabytes): ``checkfree/sim/preflight.py`` checks a simulator rank against its device,
``checkfree/swarm/cli.py`` the nodes a machine hosts against its GPUs and host RAM. Notation: d = dmodel,
H = num_heads, V = vocabulary, T = seq_l, B = batch_size (sequences per microbatch), n = B·T tokens of one
microbatch, L = n_layers_per_stage, S = n_stages, a = bytes of an activation (2 under bf16 autocast, 4 in
fp32). Sizes of what ``checkfree/model.py`` builds (the paper's architectures, docs/paper.md §6; ``hf_config``:
MLP width 4d, untied LM head, no attention or MLP biases in LLaMa):

    parameters   LLaMa: E = V·d;  block = 16d² + 2d (q, k, v, o: d×d; gate, up, down: d×4d; 2 RMSNorms);
                        E⁻¹ = d + V·d (final RMSNorm + LM head)
                 GPT:   E = V·d + T·d (+ learned positions);  block = 12d² + 13d (c_attn d×3d + 3d, c_proj
                        d×d + d, c_fc d×4d + 4d, c_proj 4d×d + d, 2 LayerNorms 2d each);  E⁻¹ = 2d + V·d
                 P = E + E⁻¹ + S·L·block, exactly sum(p.numel()) of the built model (tests/test_memory.py)

What one simulator rank holds (checkfree/sim/trainer.py: every rank holds every stage; fp32 master weights,
gradients accumulated over the microbatches, Adam's exp_avg and exp_avg_sq; the microbatches run one after the
other, each backward right after its forward, so one microbatch's activations are alive at a time):

    weights 4P;  gradients 4P;  Adam 8P
    autocast copies   2 · (matmul weights: 16d² per LLaMa block, 12d² per GPT block, V·d for the head) under
                      bf16 autocast (torch caches one bf16 copy of each weight per autocast region and the
                      backward keeps it); 0 in fp32. Counted for every block with activation checkpointing too:
                      the cache holds them all until the microbatch's forward ends
    activations of one microbatch (the tensors autograd saves, measured with saved_tensors_hooks on the sdpa
    path: q, k, v, the output and its logsumexp are saved, never the T×T scores; the residual stream and the
    norms stay fp32 under autocast):
      LLaMa block   n·d·(16 + c + 20a) + 8n + 4·B·H·T      c = 10 (five bf16 casts of the normed input for
                    q, k, v, gate, up) under autocast, 8 (the two fp32 RMSNorm outputs) in fp32;
                    16 = input and normalised input of both RMSNorms; 4a = q, k, v, attention output;
                    16a = gate, silu(gate), up, their product (4d each); 8n = two rsqrt; 4BHT = logsumexp
      GPT block     n·d·(8 + c + 24a) + 16n + 4·B·H·T      c = 4 (two bf16 casts) or 8 (two fp32 LayerNorm
                    outputs); 8 = both LayerNorm inputs; 4a = c_attn output (q, k, v) + attention output;
                    20a = c_fc output, three tanh-GELU intermediates and the GELU output (4d each);
                    16n = LayerNorm mean and rstd
      rotary        8·T·(d/H) per transformer stage (LLaMa cos and sin, fp32)
      embedding     8·B·(T+1) (the token ids) + 8T for GPT's positions
      head          LLaMa n·d·(8 + c_h) + 4n: the final RMSNorm's input, normalised input and rsqrt;
                    GPT n·d·(4 + c_h) + 8n: ln_f's input, mean and rstd; c_h = 2 (the bf16 cast the LM head
                    keeps) or 4 (the fp32 norm output); then 4·n·V + 8n: log-probabilities in fp32
                    (pipeline.forward_loss casts the logits to fp32 before cross_entropy) and labels
      fused head    (``--fused-loss``, checkfree/loss.py: Liger-Kernel's fused linear cross-entropy, which never
                    holds the n × V logits) the final norm's tensors as above without c_h (the head's matmul
                    runs inside the loss and keeps no input), plus what the loss computes in its forward and
                    keeps for the backward: the gradients of the normalised input (4·n·d, fp32 like the input)
                    and of the head's weight (4·V·d, the parameter's fp32), the labels, the per-token losses and
                    the label mask (8n + 4n + n)
    with activation checkpointing (Chen et al. 2016, checkfree/model.py: ``torch.utils.checkpoint`` per block)
    each block keeps only its fp32 input (4·n·d) and one block's activations exist at a time, recomputed in its
    backward
    temporaries  the peak is taken at the start of the backward, the head's: log-softmax's backward holds
                 the gradient of the log-probabilities and of the logits, 8·n·V bytes, on top of everything
                 saved. The fused head's loss instead computes the logits of one chunk of C tokens at a time
                 and their gradient in place: C·V·a bytes, plus three C × d tensors (the chunk's bf16 cast, the
                 gradients of its input, the cast for the weight's gradient), plus in fp32 a V × d product per
                 chunk (Liger adds an fp32 matmul's result into the weight's gradient there; under bf16 it
                 accumulates in place). C follows Liger's rule (:func:`liger_chunk_tokens`); the first block's
                 backward (12·a·n·d) then usually outweighs it, so the transient is the larger of the two.
                 With activation checkpointing the head's tensors are gone when a block is
                 recomputed, so the peak is the larger of (head saved + 8nV) and (one block + 12·a·n·d, the
                 gradients of its MLP intermediates). The optimizer step (after the activations are freed)
                 needs 8 bytes per parameter of the largest stage (foreach Adam's buffer, the all-reduce's
                 flat buffer); the larger of the two is taken. Plus :data:`SLACK` (5 %) of all tensor bytes
                 for allocator rounding and fragmentation; on the CPU also :data:`CPU_HEAP_FACTOR` (0.5) ×
                 (what the forward allocates + temporaries), what glibc's heaps keep of freed blocks
                 (measured; with activation checkpointing the forward still allocates every block's
                 activations, and frees them at once).
    strategy copies   checkfree_plus: stage 0's weights (4·E + 4·E⁻¹) on the device; redundant: weights and
                      Adam of every stage (12P) on the device; ec_snapshot: S + 1 fp32 vectors of 3·P_stage
                      + one step per tensor in host RAM; checkpoint and one: a snapshot of every stage's
                      weights and Adam (12P) in host RAM, two in ``save_mode`` memory (the committed one and the
                      one being taken); ladder: those of the rungs it keeps
    runtime      CUDA: :data:`CUDA_CONTEXT_BYTES` on the GPU and :data:`CUDA_HOST_BYTES` of host RAM; every
                 process: :data:`PROCESS_BYTES` of host RAM

A swarm node (checkfree/swarm/node/compute.py) holds one stage: weights, gradients and Adam of that stage; the
activations of ``in_flight`` microbatches (each keeps its own autocast copies of the stage's weights, its
input and its fp32 output); a stage-0 node keeps the ids and embedding output of each in-flight microbatch and
runs the head of one microbatch at a time; at the gradient exchange (when no activation is alive) the
gradients of the R − 1 other replicas; under ``keeps_stage0_copy`` settings stage 1 holds a copy of E and stage
S one of E⁻¹ (docs/paper.md §3). A node's host RAM also has its process, and up to :data:`SEND_POOL_BYTES` of send
buffers.

A run fits when its estimate is at most :data:`FIT_FRACTION` (90 %) of the memory it gets: the GPU's
``total_memory``, or the host's ``MemAvailable``, shared by every rank or node of the machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from checkfree.config import Config, parse_ladder_rungs
from checkfree.data.tokenizer import HUB_TOKENIZERS

GIB = 2**30
FIT_FRACTION = 0.9
"""A run fits when the estimate is ≤ 90 % of the memory: the rest is the margin for what the estimate misses."""
SLACK = 0.05
"""Allocator rounding and fragmentation: 5 % of every tensor byte estimated."""
PROCESS_BYTES = 336 * 2**20
"""Host RSS of one rank or node process before it builds anything: 335 MiB measured on the development machine
(torch 2.13 CPU, transformers 5.23) for ``python -c "import checkfree.swarm.node.node"`` and 333 MiB for
``import checkfree.sim.launch`` (the LLaMa and GPT-2 modules load); a bare ``python -c "import torch,
transformers"`` is 238 MiB there."""
CUDA_CONTEXT_BYTES = 1 * GIB
"""GPU memory that is not tensors: the CUDA context, cuBLAS/cuDNN workspaces (an assumption, not measured here:
on an H100 with torch 2.x the context alone is about 0.5 GiB)."""
CUDA_HOST_BYTES = 1 * GIB
"""Host RSS that loading the CUDA libraries adds to a process (an assumption, not measured here: lazy loading
keeps it near 0.5–1 GiB)."""
CPU_HEAP_FACTOR = 0.5
"""On the CPU, extra RSS per byte of activations and temporaries: glibc keeps freed blocks in its heaps (its mmap
threshold rises to the size of the blocks freed, up to 32 MiB), so a step's peak RSS exceeds its live tensors.
Measured with tests/memory_worker.py (peak RSS growth of training steps, torch 2.13 CPU, glibc defaults): tiny
and small configs at batch 2–32, seq 128–512, d 128–512 grew 0.45–0.8 × their activations and temporaries
beyond the live estimate; with ``MALLOC_MMAP_THRESHOLD_=65536`` the growth is within 8 % of the live estimate.
With activation checkpointing the factor applies to the activations the forward allocates (and frees): the
estimate was then 0.78–1.08 × the measured growth (tiny and small, batch 8 and 32)."""
SEND_POOL_BYTES = 256 * 2**20
"""Most bytes a swarm node's send buffers keep (checkfree/swarm/wire/send_buffers.py: POOL_BYTES)."""


def gib(nbytes: float) -> str:
    """``nbytes`` in GiB for a sentence or a table: two decimals, or three significant digits when huge."""
    value = nbytes / GIB
    return f"{value:,.2f} GiB" if value < 1e5 else f"{value:.3g} GiB"


def model_vocab_size(cfg: Config) -> int:
    """The vocabulary a run's model gets: the hub tokenizer's (llama2, gpt2; checkfree.data.tokenizer's
    ``HUB_TOKENIZERS``), else the config's ``vocab_size`` (the byte-level BPE's size, an upper bound when a small
    corpus yields fewer merges)."""
    hub = HUB_TOKENIZERS.get(cfg.tokenizer_name)
    return cfg.vocab_size if hub is None else hub.vocab_size


# ------------------------------------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class ParameterCounts:
    """Exact parameter counts of the stages ``checkfree/model.py`` builds (formulas: module docstring).

    Attributes:
        embedding: E (token embedding, plus learned positions for GPT).
        head: E⁻¹ (final norm + untied LM head).
        block: one transformer block.
        blocks: transformer blocks in the model (S·L).
        block_matmul: weights of one block that go through a matmul (cast to bf16 under autocast).
        head_matmul: the LM head's weight (V·d).
    """

    embedding: int
    head: int
    block: int
    blocks: int
    block_matmul: int
    head_matmul: int

    @property
    def stage0(self) -> int:
        return self.embedding + self.head

    @property
    def total(self) -> int:
        return self.stage0 + self.blocks * self.block

    def transformer_stage(self, layers: int) -> int:
        """Parameters of a transformer stage of ``layers`` blocks."""
        return layers * self.block


def parameter_counts(cfg: Config, vocab_size: int) -> ParameterCounts:
    """Exact counts of the model ``checkfree.model.build_hf_model(cfg, vocab_size, …)`` builds (docstring formulas)."""
    d, V = cfg.dmodel, vocab_size
    if cfg.architecture == "LLaMa":
        block_matmul = 4 * d * d + 3 * d * 4 * d
        return ParameterCounts(V * d, d + V * d, block_matmul + 2 * d, cfg.n_layers, block_matmul, V * d)
    block_matmul = d * 3 * d + d * d + d * 4 * d + 4 * d * d
    block = block_matmul + (3 * d + d + 4 * d + d) + 2 * (2 * d)
    return ParameterCounts(V * d + cfg.seq_l * d, 2 * d + V * d, block, cfg.n_layers, block_matmul, V * d)


# ------------------------------------------------------------------------------------------------ activations


@dataclass(frozen=True)
class Activations:
    """One microbatch of ``batch`` sequences, in bytes: what autograd saves for the backward, and the
    transients of the backward (``*_backward``); formulas: module docstring."""

    block: int
    """One transformer block, its input included."""
    block_input: int
    """What a checkpointed block keeps: its fp32 input (4·n·d)."""
    block_backward: int
    """The gradients of a block's MLP intermediates while its backward runs (12·a·n·d)."""
    rotary: int
    """LLaMa's cos and sin of one transformer stage (0 for GPT)."""
    embedding: int
    """The token ids (and GPT's position ids)."""
    head: int
    """Final norm, log-probabilities (fp32) and labels; with the fused loss the final norm, the gradients of its
    output and of the head's weight, and the labels."""
    head_backward: int
    """The gradients of the log-probabilities and of the logits in log-softmax's backward (8·n·V); with the fused
    loss one chunk's logits and its C × d temporaries."""


def liger_chunk_tokens(tokens: int, dmodel: int, vocab_size: int) -> int:
    """Tokens per chunk of Liger-Kernel's fused linear cross-entropy (liger-kernel 0.8.5,
    ``liger_kernel/ops/fused_linear_cross_entropy.py``, ``fused_linear_cross_entropy_forward`` with its default
    ``chunk_mem_const`` 1): the logits of a chunk should take about as many elements as the n × d input, so
    ``inc_factor = ceil(V / d)`` and C = min(next power of 2 of ceil(n / inc_factor), n).

    E.g. the 124M config (n = 64 × 512 = 32,768, d = 512, V = 32,000): inc_factor 63, C = 1,024 tokens.
    """
    inc_factor = -(-vocab_size // dmodel)
    per_chunk = -(-tokens // inc_factor)
    return min(1 << (per_chunk - 1).bit_length(), tokens)


def activations(
    cfg: Config, vocab_size: int, batch: int, autocast: bool, fused_loss: bool = False
) -> Activations:
    """Saved-for-backward bytes of one microbatch of ``batch`` sequences of ``cfg.seq_l`` tokens.

    ``autocast``: bf16 autocast (CUDA's default, checkfree/devices.py), else fp32. ``fused_loss``: the head and
    loss through Liger-Kernel's fused linear cross-entropy (checkfree/loss.py). The formulas are the module
    docstring's; tests/test_memory.py checks the plain path's against the tensors autograd saves
    (saved_tensors_hooks); the fused path's follow Liger's source (its kernels run on CUDA only).
    """
    d, H, T, V = cfg.dmodel, cfg.num_heads, cfg.seq_l, vocab_size
    n = batch * T
    a = 2 if autocast else 4
    lse = 4 * batch * H * T
    if cfg.architecture == "LLaMa":
        casts = 10 if autocast else 8
        block = n * d * (16 + casts + 20 * a) + 8 * n + lse
        rotary = 2 * 4 * T * (d // H)
        norm = n * d * 8 + 4 * n
        embedding = 8 * batch * (T + 1)
    else:
        casts = 4 if autocast else 8
        block = n * d * (8 + casts + 24 * a) + 16 * n + lse
        rotary = 0
        norm = n * d * 4 + 8 * n
        embedding = 8 * batch * (T + 1) + 8 * T
    if fused_loss:
        C = liger_chunk_tokens(n, d, V)
        head = norm + 4 * n * d + 4 * V * d + 13 * n
        head_backward = C * V * a + 3 * C * d * a + (0 if autocast else 4 * V * d)
    else:
        head = norm + n * d * (2 if autocast else 4) + 4 * n * V + 8 * n
        head_backward = 8 * n * V
    return Activations(block, 4 * n * d, 12 * a * n * d, rotary, embedding, head, head_backward)


# ------------------------------------------------------------------------------------------------ estimates


PARTS = (
    ("weights", "weights (fp32)"),
    ("gradients", "gradients (fp32)"),
    ("optimizer", "Adam exp_avg + exp_avg_sq"),
    ("copies", "strategy copies"),
    ("autocast_copies", "bf16 weight copies (autocast)"),
    ("activations", "activations"),
    ("temporaries", "temporaries + allocator slack"),
    ("runtime", "runtime"),
)
"""(field, label) of each part of a :class:`MemoryEstimate`, in table order."""


@dataclass(frozen=True)
class MemoryEstimate:
    """One process's memory, in bytes, where it computes (``device``): the parts of :data:`PARTS` and ``total``.

    ``host`` is what it holds in host RAM besides: on CUDA the process itself and host-side strategy copies; on
    the CPU 0 (everything is in the parts). ``notes`` say what a part counts (printed by :meth:`describe`).
    """

    device: str
    precision: str
    activation_checkpointing: bool
    weights: int
    gradients: int
    optimizer: int
    copies: int
    autocast_copies: int
    activations: int
    temporaries: int
    runtime: int
    host: int = 0
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Bytes on ``device`` (host RAM on the CPU)."""
        return sum(getattr(self, name) for name, _ in PARTS)

    @property
    def static(self) -> int:
        """Weights, gradients, Adam state and strategy copies: what no microbatch size changes."""
        return self.weights + self.gradients + self.optimizer + self.copies

    def describe(self, title: str) -> str:
        """A short table in GiB: ``title``, one line per part, the total (and the host RAM on CUDA)."""
        lines = [title]
        for name, label in PARTS:
            note = self.notes.get(name)
            lines.append(
                f"  {label:<32}{getattr(self, name) / GIB:>12,.2f} GiB{f'  ({note})' if note else ''}"
            )
        lines.append(f"  {'total on ' + self.device:<32}{self.total / GIB:>12,.2f} GiB")
        if self.host:
            lines.append(f"  {'host RAM besides':<32}{self.host / GIB:>12,.2f} GiB")
        return "\n".join(lines)


def _copies(cfg: Config, counts: ParameterCounts, strategy: str) -> tuple[int, int, str]:
    """(bytes on the device, bytes in host RAM, what they are) of the copies ``strategy`` keeps (docstring)."""
    rungs = set(parse_ladder_rungs(cfg.ladder_rungs)) if strategy == "ladder" else set()
    device = host = 0
    what = []
    if strategy == "checkfree_plus" or "neighbour" in rungs:
        device += 4 * counts.stage0
        what.append("stage 0 weights")
    if strategy == "redundant" or "redundant" in rungs:
        device += 12 * counts.total
        what.append("every stage's replica (weights + Adam)")
    if strategy == "ec_snapshot" or "ec_snapshot" in rungs:
        tensors = 9 if cfg.architecture == "LLaMa" else 12  # parameter tensors per block: one step each
        per_stage = cfg.n_layers_per_stage * (3 * counts.block + tensors)  # stage_copy.flatten's layout
        host += 4 * (cfg.n_stages + 1) * per_stage
        what.append("REFT snapshots + parity, host RAM")
    if strategy in ("checkpoint", "one"):
        host += 12 * counts.total * (2 if cfg.save_mode == "memory" else 1)
        what.append(f"{cfg.save_mode} snapshot, host RAM")
    return device, host, ", ".join(what)


def _estimate(
    device: str,
    autocast: bool,
    activation_checkpointing: bool,
    params: int,
    *,
    copies: int,
    casts: int,
    saved: int,
    transient: int,
    heap: int,
    runtime: int,
    host: int,
    notes: dict[str, str],
    held: int = 0,
) -> MemoryEstimate:
    """The estimate of a process that trains ``params`` parameters in fp32 with Adam (weights and gradients 4
    bytes each, Adam 8: 16 bytes/parameter) holding ``copies`` bytes of strategy copies, ``casts`` of bf16 weight
    casts, ``saved`` of activations, ``held`` of gradients beyond the parameters' own and ``transient`` of backward
    temporaries; its temporaries are ``transient``,
    :data:`SLACK` of all those tensors and ``heap`` (the CPU allocator's, module docstring)."""
    tensors = 16 * params + held + copies + casts + saved + transient
    return MemoryEstimate(
        device=device,
        precision="bf16 autocast" if autocast else "fp32",
        activation_checkpointing=activation_checkpointing,
        weights=4 * params,
        gradients=4 * params + held,
        optimizer=8 * params,
        copies=copies,
        autocast_copies=casts,
        activations=saved,
        temporaries=transient + math.ceil(SLACK * tensors) + heap,
        runtime=runtime,
        host=host,
        notes=notes,
    )


def simulator_estimate(
    cfg: Config,
    vocab_size: int,
    device: str,
    autocast: bool,
    activation_checkpointing: bool = False,
    strategy: str = "no_failure",
    batch: int | None = None,
    fused_loss: bool = False,
) -> MemoryEstimate:
    """Peak memory of one simulator rank (formulas: module docstring).

    Args:
        cfg: the run's config. vocab_size: the model's vocabulary (:func:`model_vocab_size`).
        device: "cpu" or "cuda" (where the rank computes). autocast: bf16 autocast, else fp32.
        activation_checkpointing: each block keeps only its input and is recomputed in its backward.
        strategy: the canonical setting (its copies are counted). batch: sequences per microbatch (default
            ``cfg.batch_size``; preflight tries smaller ones to say what would fit).
        fused_loss: the head and loss through Liger-Kernel's fused linear cross-entropy (``--fused-loss``).
    """
    counts = parameter_counts(cfg, vocab_size)
    P = counts.total
    act = activations(cfg, vocab_size, cfg.batch_size if batch is None else batch, autocast, fused_loss)
    copies_device, copies_host, copies_what = _copies(cfg, counts, strategy)
    fixed = act.embedding + cfg.n_stages * act.rotary
    forward = fixed + counts.blocks * act.block + act.head  # what the forward allocates, kept or not
    if activation_checkpointing:
        inputs = counts.blocks * act.block_input
        head_phase = (fixed + inputs + act.head, act.head_backward)
        block_phase = (fixed + inputs + act.block, act.block_backward)
        saved, transient = max(head_phase, block_phase, key=sum)
        act_note = f"1 microbatch: {counts.blocks} block inputs + the larger of the head and one block"
    else:
        # the head's backward first, then the last block's: with the fused loss's small chunks that one can be larger
        head_first = max(act.head_backward, act.block_backward) if fused_loss else act.head_backward
        saved, transient = forward, head_first
        act_note = f"1 microbatch of {cfg.batch_size if batch is None else batch} × {cfg.seq_l} tokens"
    largest_stage = max(counts.stage0, counts.transformer_stage(cfg.n_layers_per_stage))
    transient = max(transient, 8 * largest_stage - saved)
    casts = 2 * (counts.blocks * counts.block_matmul + counts.head_matmul) if autocast else 0
    heap = 0
    if device == "cpu":
        copies_device += copies_host
        heap = math.ceil(CPU_HEAP_FACTOR * (forward + transient))
        runtime, host, runtime_note = PROCESS_BYTES, 0, "the Python process"
    else:
        runtime, host, runtime_note = (
            CUDA_CONTEXT_BYTES,
            PROCESS_BYTES + CUDA_HOST_BYTES + copies_host,
            "CUDA context",
        )
    notes = {"activations": act_note, "runtime": runtime_note}
    if fused_loss:
        chunk = liger_chunk_tokens(
            (cfg.batch_size if batch is None else batch) * cfg.seq_l, cfg.dmodel, vocab_size
        )
        notes["temporaries"] = f"fused loss: logits of {chunk:,} tokens at a time"
    if copies_what:
        notes["copies"] = copies_what
    return _estimate(
        device,
        autocast,
        activation_checkpointing,
        P,
        copies=copies_device,
        casts=casts,
        saved=saved,
        transient=transient,
        heap=heap,
        runtime=runtime,
        host=host,
        notes=notes,
    )


def swarm_node_estimate(
    cfg: Config,
    vocab_size: int,
    stage: int,
    device: str,
    in_flight: int,
    replicas: int,
    keeps_stage0_copy: bool,
) -> MemoryEstimate:
    """Peak memory of one swarm node holding ``stage`` (0 = embedding + head) on ``device`` ("cpu"/"cuda").

    Weights, gradients and Adam of the stage; ``in_flight`` microbatches of activations (each with its own bf16
    weight copies on CUDA); up to ``in_flight − 1`` microbatches' parameter gradients held until their
    predecessors are added (the sums go in microbatch order, checkfree.swarm.node.compute.OrderedGradients:
    4·P bytes each); at the gradient exchange the R − 1 other replicas' gradients (no activation is alive
    then, so the larger of the two phases counts); the stage-0 copy a stage-1 or stage-S node holds when
    ``keeps_stage0_copy``; the last :data:`SWARM_UPDATES_KEPT` updates (4·P bytes each) kept for a replacement
    that catches up in the background (issue 39 point 3); send buffers; the process (module docstring).
    """
    autocast = device == "cuda"
    counts = parameter_counts(cfg, vocab_size)
    act = activations(cfg, vocab_size, cfg.batch_size, autocast)
    n_d = cfg.batch_size * cfg.seq_l * cfg.dmodel
    if stage == 0:
        P = counts.stage0
        per_microbatch = act.embedding + 4 * n_d  # ids and the embedding output of each microbatch in flight
        saved = in_flight * per_microbatch + act.head  # + the head of one microbatch at a time
        backward = act.head_backward
        casts = 2 * counts.head_matmul if autocast else 0
        act_note = f"{in_flight} in flight + one head"
    else:
        L = cfg.n_layers_per_stage
        P = counts.transformer_stage(L)
        per_microbatch = L * act.block + act.rotary + 4 * n_d  # + the stage's fp32 output
        saved = in_flight * per_microbatch
        backward = act.block_backward
        casts = in_flight * 2 * L * counts.block_matmul if autocast else 0
        act_note = f"{in_flight} microbatches in flight"
    held = (
        4 * P * (in_flight - 1)
    )  # microbatches' gradients waiting for their predecessors (OrderedGradients)
    exchange = 4 * P * (replicas - 1)  # the other replicas' gradients, when no activation is alive
    transient = max(backward, exchange - saved)
    copies = 0
    notes = {"activations": act_note, "gradients": "its own"}
    if held:
        notes["gradients"] = f"its own + up to {in_flight - 1} microbatch(es)' held in id order"
    if transient > backward:
        notes["temporaries"] = f"gradients of {replicas - 1} other replica(s) at the exchange"
    if keeps_stage0_copy and stage in (1, cfg.n_stages):
        copies = 4 * ((counts.embedding if stage == 1 else 0) + (counts.head if stage == cfg.n_stages else 0))
        notes["copies"] = "the stage-0 copy it holds"
    held += SWARM_UPDATES_KEPT * 4 * P  # the last updates kept for a catching-up replacement
    notes["gradients"] += f" + the last {SWARM_UPDATES_KEPT} updates kept"
    send = min(SEND_POOL_BYTES, 2 * max(4 * n_d, 4 * P))
    heap = 0
    if device == "cpu":
        heap = math.ceil(CPU_HEAP_FACTOR * (saved + held + transient))
        runtime, host = PROCESS_BYTES + send, 0
        notes["runtime"] = "the process + send buffers"
    else:
        runtime, host = CUDA_CONTEXT_BYTES, PROCESS_BYTES + CUDA_HOST_BYTES + send
        notes["runtime"] = "CUDA context"
    return _estimate(
        device,
        autocast,
        False,
        P,
        copies=copies,
        casts=casts,
        saved=saved,
        transient=transient,
        heap=heap,
        runtime=runtime,
        host=host,
        notes=notes,
        held=held,
    )


SWARM_UPDATES_KEPT = 4
"""Updates (averaged, clipped gradients, 4·P bytes each) a serving swarm node keeps for a replacement that catches
up in the background (checkfree.swarm.node.catch_up; issue 39 point 3)."""


def storage_node_bytes(cfg: Config, vocab_size: int, keep_versions: int) -> int:
    """Host RAM of the ``checkpoint`` setting's storage node: its process and ``keep_versions`` snapshots of
    every stage's weights and Adam state (checkfree/swarm/storage.py keeps the two newest; 12 bytes/parameter)."""
    return PROCESS_BYTES + keep_versions * 12 * parameter_counts(cfg, vocab_size).total


# ------------------------------------------------------------------------------------------------ the machine


def available_host_memory() -> int:
    """Bytes of host memory available to new allocations: ``MemAvailable`` of /proc/meminfo (Linux), else
    ``os.sysconf`` available pages × page size."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gpu_memory(index: int) -> int | None:
    """Bytes of memory of CUDA device ``index`` (``torch.cuda.get_device_properties(index).total_memory``), or
    None when torch sees no such device (then nothing is checked against it)."""
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def fits(nbytes: int, memory: int) -> bool:
    """Whether ``nbytes`` fits in ``memory`` with the safety margin: ≤ :data:`FIT_FRACTION` of it."""
    return nbytes <= FIT_FRACTION * memory


# ------------------------------------------------------------------------------------------------ a swarm machine


@dataclass(frozen=True)
class NodeMemory:
    """One node this machine hosts: its id, stage, device ("cpu" or "cuda:N") and estimate."""

    node: int
    stage: int
    device: str
    estimate: MemoryEstimate


@dataclass(frozen=True)
class MachineMemory:
    """The nodes one machine hosts, added up per GPU and in host RAM, against what the machine has.

    Attributes:
        nodes: the stage nodes. processes: other processes of this machine and their host RAM (the supervisor
            or launcher, the forkserver nodes fork from, the storage node). gpu_capacity: ``total_memory`` of
            each GPU used ("cuda:N" → bytes). host_capacity: available host RAM.
    """

    nodes: list[NodeMemory]
    processes: list[tuple[str, int]]
    gpu_capacity: dict[str, int | None]
    host_capacity: int

    def gpu_need(self) -> dict[str, int]:
        """Bytes each GPU's nodes need ("cuda:N" → bytes)."""
        need: dict[str, int] = {}
        for n in self.nodes:
            if n.device != "cpu":
                need[n.device] = need.get(n.device, 0) + n.estimate.total
        return need

    def host_need(self) -> int:
        """Host RAM of every process: CPU nodes whole, CUDA nodes' host part, the other processes."""
        nodes = sum(n.estimate.total if n.device == "cpu" else n.estimate.host for n in self.nodes)
        return nodes + sum(b for _, b in self.processes)

    def short(self) -> list[str]:
        """Where the need exceeds :data:`FIT_FRACTION` of the memory: "host" and/or "cuda:N"."""
        out = [] if fits(self.host_need(), self.host_capacity) else ["host"]
        capacity = self.gpu_capacity
        return out + [
            g for g, b in self.gpu_need().items() if capacity[g] is not None and not fits(b, capacity[g])
        ]

    @property
    def fits(self) -> bool:
        return not self.short()

    def lines(self) -> list[str]:
        """Per node its total and parts, the other processes, then the totals per GPU and in host RAM."""
        out = ["memory, estimated from the config's shapes (checkfree/memory.py; docs/swarm.md#memory):"]
        for n in self.nodes:
            e = n.estimate
            where = "" if n.device == "cpu" else f" + {gib(e.host)} host RAM"
            out.append(
                f"  node {n.node} (stage {n.stage}) on {n.device}: {gib(e.total)}{where} = weights, gradients "
                f"and Adam {gib(e.weights + e.gradients + e.optimizer)}, activations {gib(e.activations)} "
                f"({e.notes['activations']}), temporaries {gib(e.temporaries)}, other {gib(e.copies + e.autocast_copies + e.runtime)}"
            )
        for name, nbytes in self.processes:
            out.append(f"  {name}: {gib(nbytes)} host RAM")
        for gpu, need in sorted(self.gpu_need().items()):
            count = sum(1 for n in self.nodes if n.device == gpu)
            capacity = self.gpu_capacity[gpu]
            if capacity is None:
                out.append(f"  {gpu}: {count} node(s), {gib(need)} (torch sees no {gpu} here: not checked)")
            else:
                out.append(f"  {gpu}: {count} node(s), {gib(need)} of {gib(capacity)}{self._verdict(gpu)}")
        out.append(
            f"  host RAM of this machine: {gib(self.host_need())} of {gib(self.host_capacity)} available"
            f"{self._verdict('host')}"
        )
        return out

    def _verdict(self, where: str) -> str:
        if where in self.short():
            return ": does not fit"
        return f": fits (≤ {FIT_FRACTION:.0%})"

    def sentence(self, advice: str = "") -> str:
        """The refusal: one sentence naming the first memory that is short, its need and its size."""
        where = self.short()[0]
        ids = f"{self.nodes[0].node}..{self.nodes[-1].node}" if self.nodes else "none"
        if where == "host":
            need, have, what = self.host_need(), self.host_capacity, "of host RAM available"
        else:
            need, have, what = self.gpu_need()[where], self.gpu_capacity[where], f"on {where}"
        largest = max(self.nodes, key=lambda n: n.estimate.total, default=None)
        biggest = f", the largest node {largest.node} {gib(largest.estimate.total)}" if largest else ""
        way = (
            f"it would fit with {advice}"
            if advice
            else "host fewer nodes here (--start/--end) or use a larger machine"
        )
        return (
            f"the swarm nodes {ids} this machine hosts need about {gib(need)} {'of host RAM' if where == 'host' else 'on ' + where} "
            f"(estimated from the config's shapes{biggest}), but there {'is' if where == 'host' else 'are'} "
            f"{gib(have)} {what} and a run must fit in {FIT_FRACTION:.0%} of it; {way}."
        )


def machine_memory(
    cfg: Config,
    vocab_size: int,
    nodes: list[tuple[int, int, str]],
    in_flight: int,
    replicas: int,
    keeps_stage0_copy: bool,
    processes: list[tuple[str, int]],
) -> MachineMemory:
    """Add up :func:`swarm_node_estimate` over ``nodes`` ((node id, stage, device "cpu" or "cuda:N")) and compare
    with each GPU's ``total_memory`` and the host's available RAM; ``processes``: the machine's other processes
    and their host RAM."""
    estimates = [
        NodeMemory(
            node,
            stage,
            device,
            swarm_node_estimate(
                cfg, vocab_size, stage, device.split(":")[0], in_flight, replicas, keeps_stage0_copy
            ),
        )
        for node, stage, device in nodes
    ]
    gpus = sorted({n.device for n in estimates if n.device != "cpu"})
    capacity = {g: gpu_memory(int(g.split(":")[1])) for g in gpus}
    return MachineMemory(estimates, processes, capacity, available_host_memory())
