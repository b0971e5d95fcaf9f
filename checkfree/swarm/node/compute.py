"""A node's stage computation: building the stage, its batches, the microbatch forward/backward.

Microbatch flow (docs/paper.md §8). A stage-0 node drives one pipeline (checkfree.swarm.node.driver), the others
relay (checkfree.swarm.node.relay); both compute with :class:`StageWorker`. For microbatch ``mb`` of
the iteration stage 0 computes ``route = [itself, node of order[0], …, node of order[S−1]]`` with ``order =
stage_order(mb, S, swaps)`` (CheckFree+ swaps on odd microbatches), embeds the batch and sends FORWARD to
``route[1]`` with ``pos = 1``. The node at ``pos = k`` runs its stage and forwards to ``route[k+1]``; the
last one sends the output back to ``route[0]`` (``pos = len(route)``), which applies the head, the loss
(token-mean cross entropy / mb_count, docs/paper.md §6) and sends BACKWARD to ``route[-1]``. BACKWARD walks the route
back to stage 0, which finishes the embedding's backward. At most ``in_flight`` microbatches of a pipeline
are between embed and their last backward. Each microbatch's parameter gradients are added up in an order fixed
by microbatch id, whatever order its messages arrive in (:class:`OrderedGradients`), and reach ``.grad`` at the
iteration's exchange (:meth:`StageWorker.settle`). Every message carries its ``attempt``: the number of one try
at an iteration, increasing: anything from an older attempt is dropped, which is how an aborted attempt's in-flight microbatches disappear.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import torch
from torch import nn

from checkfree.config import Config
from checkfree.loss import head_loss
from checkfree.model import build_hf_model, split_model
from checkfree.swarm.devices import autocast_for
from checkfree.swarm.wire.protocol import ProtocolError, Rejected

log = logging.getLogger(__name__)


def build_stage(
    cfg: Config, stage: int, vocab_size: int, seed: int, device: torch.device | None = None
) -> nn.Module:
    """Stage ``stage`` (0 = embedding + head, 1..S transformer) with seeded, replica-identical init.

    Each node builds only a one-stage model (seed ``seed·1000 + stage``) and keeps the part it needs, so
    nodes never hold the whole model; replicas of a stage get identical weights. The init runs where torch's
    default device is (the CPU), so a replica on a GPU starts from the same bits; ``device`` then holds the
    fp32 parameters (the master weights: autocast computes in bf16, Adam updates fp32).
    """
    one = dataclasses.replace(cfg, n_stages=1)
    stages = split_model(build_hf_model(one, vocab_size, seed * 1000 + stage), one)
    module = stages[0] if stage == 0 else stages[1]
    return module if device is None else module.to(device)


class SyntheticBatches:
    """Learnable random batches for tests: row ``r`` is ``(start + k·t) % V`` with seeded start and k ∈ {1,2,3}."""

    def __init__(self, vocab_size: int, seq_len: int, batch_size: int, rank: int, seed: int) -> None:
        self.v, self.t, self.b, self.rank, self.seed = vocab_size, seq_len, batch_size, rank, seed

    def batch(self, step: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 101 + self.rank)
        start = torch.randint(0, self.v, (self.b, 1), generator=g)
        k = torch.randint(1, 4, (self.b, 1), generator=g)
        return (start + k * torch.arange(self.t + 1)) % self.v  # (B, T+1) int64


def make_batches(cfg: Config, data: str, rank: int, world: int, vocab_size: int, cache_dir: Path):
    """The batch source of pipeline ``rank`` of ``world``: checkfree.data or :class:`SyntheticBatches`."""
    if data == "synthetic":
        return SyntheticBatches(vocab_size, cfg.seq_l, cfg.batch_size, rank, cfg.data_seed)
    from checkfree.data.batches import BatchSource
    from checkfree.data.corpus import DataSpec, prepare_corpus

    spec = DataSpec.from_config(cfg, max_train_tokens=cfg.max_train_tokens, cache_dir=cache_dir)
    corpus = prepare_corpus(spec)
    if corpus.vocab_size != vocab_size:
        raise ValueError(f"the local corpus has vocabulary {corpus.vocab_size}; the swarm uses {vocab_size}.")
    return BatchSource(
        corpus.train, cfg.seq_l, cfg.batch_size, rank=rank, world_size=world, seed=cfg.data_seed
    )


SYNTHETIC_VALIDATION_RANK = -1
"""The pipeline index whose synthetic batches are the validation batches of ``"data": "synthetic"`` (tests): no
training pipeline has it, so they are held out."""


def validation_batches_for(cfg: Config, data: str, vocab_size: int, cache_dir: Path) -> list[torch.Tensor]:
    """The model config's fixed validation batches, the simulator's for that config
    (checkfree.data.batches.validation_batches: the first ``validation`` × ``batch_size`` held-out windows), or for
    ``"synthetic"`` data batches 0 … ``validation`` − 1 of :class:`SyntheticBatches` at pipeline
    :data:`SYNTHETIC_VALIDATION_RANK` → ``validation`` tensors of (batch_size, seq_l + 1) int64.

    Raises:
        ValueError: the held-out set is smaller than the validation batches, or the corpus's vocabulary is not
            the swarm's.
    """
    if data == "synthetic":
        source = SyntheticBatches(
            vocab_size, cfg.seq_l, cfg.batch_size, SYNTHETIC_VALIDATION_RANK, cfg.data_seed
        )
        return [source.batch(i) for i in range(cfg.validation)]
    from checkfree.data.batches import validation_batches
    from checkfree.data.corpus import DataSpec, prepare_corpus

    spec = DataSpec.from_config(cfg, max_train_tokens=cfg.max_train_tokens, cache_dir=cache_dir)
    corpus = prepare_corpus(spec)
    if corpus.vocab_size != vocab_size:
        raise ValueError(f"the local corpus has vocabulary {corpus.vocab_size}; the swarm uses {vocab_size}.")
    return validation_batches(corpus, cfg.batch_size, cfg.validation, cfg.seq_l)


Chain = tuple[int, int]
"""(pipeline, part) of :class:`OrderedGradients`: part 0 = the backward through the stage (a transformer stage's
blocks, stage 0's embedding), part 1 = stage 0's head and loss."""


@dataclasses.dataclass
class _ChainSum:
    """One chain's running sum (parameter name → tensor) of microbatches ``0 … next − 1``, and the per-microbatch
    gradients that came before their turn."""

    total: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    next: int = 0
    held: dict[int, dict[str, torch.Tensor]] = dataclasses.field(default_factory=dict)

    def add(self, grads: dict[str, torch.Tensor]) -> None:
        for name, g in grads.items():
            if name in self.total:
                self.total[name].add_(g)
            else:
                self.total[name] = g  # autograd.grad's fresh tensor: no copy


class OrderedGradients:
    """A node's parameter gradients of one attempt, added up in an order fixed by microbatch id, never by arrival.

    Why: floating-point addition is not associative, and the messages of a pipeline's microbatches reach a node
    in an order that varies from run to run (with CheckFree+ swaps an odd microbatch comes from another
    neighbour than an even one; stage 0's head takes final activations from two last stages), so accumulating
    in arrival order made two runs with the same seed differ in the last bits after the first iteration
    (issue 39; docs/swarm.md "The order of the gradient sums").

    The order rule: each chain (pipeline, part) sums its microbatches' gradients in microbatch order 0, 1, 2, …
    (every microbatch of a pipeline takes the same node of each stage, checkfree.swarm.config.route, so a chain
    sees them all); a microbatch's gradient that comes before its predecessors is held until they are added.
    :meth:`total` then adds the chains in (pipeline, part) order. The result is a function of the per-microbatch
    gradients alone, so it is bit-identical run to run.

    Memory: one running sum per chain (a node carrying one pipeline: the size of ``.grad``, as before; stage 0's
    two parts cover disjoint parameters), plus at most ``in_flight − 1`` held gradients per chain: microbatch
    ``j`` enters the pipeline only once every microbatch up to ``j − in_flight`` has finished its backward at
    stage 0, hence at every node of its route (checkfree.swarm.node.driver), so the held ones lie within
    ``in_flight − 1`` ids after the first missing one. Held ones are left only if a chain misses a microbatch
    (not with today's routes); :meth:`total` adds them in id order.
    """

    def __init__(self) -> None:
        self.chains: dict[Chain, _ChainSum] = {}
        self.peak_held = 0
        """The most per-microbatch gradients held at once since the node started (for tests and reports)."""

    def clear(self) -> None:
        self.chains.clear()

    def add(self, chain: Chain, microbatch: int, grads: dict[str, torch.Tensor]) -> None:
        """Microbatch ``microbatch``'s gradients (parameter name → tensor, parameters without one left out) on
        ``chain``; each (chain, microbatch) once per attempt (the worker's callers refuse a second copy)."""
        c = self.chains.setdefault(chain, _ChainSum())
        c.held[microbatch] = grads
        while c.next in c.held:
            c.add(c.held.pop(c.next))
            c.next += 1
        self.peak_held = max(self.peak_held, sum(len(x.held) for x in self.chains.values()))

    def has(self, chain: Chain, microbatch: int) -> bool:
        """Whether ``microbatch``'s gradient on ``chain`` was added (or is held) already this attempt: a copy sent
        again after a re-route (issue 39 point 1) is bit-identical and must not be added twice."""
        c = self.chains.get(chain)
        return c is not None and (microbatch < c.next or microbatch in c.held)

    def drop(self, pipeline: int) -> None:
        """Forget ``pipeline``'s chains (this node no longer carries it after a re-route)."""
        for chain in [c for c in self.chains if c[0] == pipeline]:
            del self.chains[chain]

    def count(self, pipeline: int) -> int:
        """The microbatches of ``pipeline`` whose backward through this stage was added (part 0's chain)."""
        c = self.chains.get((pipeline, 0))
        return 0 if c is None else c.next + len(c.held)

    def per_pipeline(self) -> dict[int, dict[str, torch.Tensor]]:
        """Each pipeline's sum: its chains in part order, each in microbatch order → pipeline → parameter name →
        tensor (only parameters that got a gradient). Consumes the sums: call once per attempt."""
        out: dict[int, dict[str, torch.Tensor]] = {}
        for chain in sorted(self.chains):
            c = self.chains[chain]
            for mb in sorted(c.held):  # a chain that missed a microbatch: the rest in id order
                c.add(c.held.pop(mb))
            mine = out.setdefault(chain[0], {})
            for name, g in c.total.items():
                if name in mine:
                    mine[name].add_(g)
                else:
                    mine[name] = g
        self.chains.clear()
        return out

    def total(self) -> dict[str, torch.Tensor]:
        """The sum over every chain in (pipeline, part) order, each in microbatch order → parameter name → tensor
        (only parameters that got a gradient). Consumes the sums: call once per attempt."""
        return add_in_pipeline_order(self.per_pipeline())


def add_in_pipeline_order(sums: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The pipelines' sums added in pipeline order → parameter name → tensor; the first pipeline's tensors are
    taken, the others added into fresh tensors (the pipelines' own sums are left unchanged)."""
    out: dict[str, torch.Tensor] = {}
    for p in sorted(sums):
        for name, g in sums[p].items():
            out[name] = out[name] + g if name in out else g
    return out


class StageWorker:
    """Forward/backward of one stage for many in-flight microbatches, keyed by (pipeline, microbatch).

    ``compute`` accumulates wall and CPU seconds (``*_s``, ``*_cpu_s``; CPU = this thread's time, i.e. the
    cost on a free core; a slowdown's sleeps count in the wall seconds only) spent in forward and backward, and op counts (for benchmarks/bench_swarm.py). On
    CUDA the kernels run asynchronously: these are host seconds to queue them (the wait lands in the send).

    The device is the module's: inputs (ids, labels) move there; on CUDA the forward passes run under bf16
    autocast (checkfree.swarm.devices.autocast_for) and what leaves the stage is fp32, as on the wire.
    """

    def __init__(self, module: nn.Module, stage: int, fused_loss: bool = False) -> None:
        self.module = module
        self.stage = stage
        self.fused_loss = fused_loss
        """Stage 0's loss through Liger-Kernel's fused linear cross-entropy (checkfree.loss.head_loss)."""
        self.device = next(module.parameters()).device
        self.autocast = autocast_for(self.device)
        self.saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.forwarded: set[tuple[int, int]] = set()
        """Keys whose forward ran this attempt: a second FORWARD of one microbatch is refused."""
        self.microbatches = 0
        """Microbatches whose backward finished here this attempt (the DP average's divisor)."""
        self.duplicates = 0
        """Re-sent microbatches whose parameter gradient was here already (not added again), since the start."""
        self.settled: dict[int, tuple[dict[str, torch.Tensor], int]] = {}
        """The last :meth:`settle`'s per-pipeline sums and microbatch counts: pipeline → (name → tensor, count)."""
        self.gradients = OrderedGradients()
        """This attempt's parameter gradients, summed in microbatch order; :meth:`settle` puts them in ``.grad``."""
        self.compute = {
            "forward_s": 0.0,
            "backward_s": 0.0,
            "forward_cpu_s": 0.0,
            "backward_cpu_s": 0.0,
            "forward_n": 0,
            "backward_n": 0,
        }
        self._cpu0 = 0.0
        self.slowdown = 1.0
        """Slowdown emulation (checkfree.swarm.slowdown): each forward and backward then sleeps (slowdown − 1) ×
        its measured seconds, counted in them; set from each attempt's ``begin``."""
        self.attempt_s = 0.0
        """Wall seconds of this attempt's forward and backward passes (sleeps of the slowdown included)."""

    def microbatch_seconds(self) -> float | None:
        """This attempt's mean wall seconds per microbatch, forward + backward (stage 0: embedding, head and loss,
        embedding backward) = :attr:`attempt_s` / :attr:`microbatches`; None before a backward finished."""
        return self.attempt_s / self.microbatches if self.microbatches else None

    def reset(self) -> None:
        """Drop every saved activation and accumulated gradient (an aborted or finished attempt)."""
        self.saved.clear()
        self.forwarded.clear()
        self.microbatches = 0
        self.attempt_s = 0.0
        self.gradients.clear()
        self.settled = {}
        self.module.zero_grad(set_to_none=True)

    def forget(self, pipelines: set[int] | list[int]) -> None:
        """A re-route (issue 39 point 1): drop the saved activations of ``pipelines`` and let each of their
        microbatches run its forward once more (the copy on the new route); their gradient chains are kept."""
        gone = set(pipelines)
        for key in [k for k in self.saved if k[0] in gone]:
            del self.saved[key]
        self.forwarded = {k for k in self.forwarded if k[0] not in gone}

    def settle(self) -> None:
        """Put this attempt's parameter gradients in :attr:`settled` (per pipeline, :meth:`OrderedGradients.
        per_pipeline`) and their sum in pipeline order in the module's ``.grad`` (None where none came), when the
        attempt's backward passes are done (its ``sync``). Nothing to put (none ran, or settled already: a
        replayed ``sync``) leaves both as they are."""
        if not self.gradients.chains:
            return
        counts = {c[0]: self.gradients.count(c[0]) for c in self.gradients.chains}
        sums = self.gradients.per_pipeline()
        self.settled = {p: (g, counts[p]) for p, g in sums.items()}
        total = add_in_pipeline_order(sums)
        for name, p in self.module.named_parameters():
            p.grad = total.get(name)

    def _backprop(
        self,
        key: tuple[int, int],
        part: int,
        out: torch.Tensor,
        grad: torch.Tensor | None,
        inp: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """Back-propagate ``grad`` from ``out`` (None: ``out`` is a scalar loss) into the parameters, whose
        gradients go to :attr:`gradients` as microbatch ``key[1]`` of chain (``key[0]``, ``part``), and into
        ``inp`` (if given) → the gradient w.r.t. ``inp``."""
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        wrt = ([inp] if inp is not None else []) + [p for _, p in named]
        got = torch.autograd.grad(out, wrt, grad, allow_unused=True)
        if self.gradients.has((key[0], part), key[1]):  # a re-sent copy: its input gradient only
            self.duplicates += 1
            return got[0] if inp is not None else None
        params = got[1:] if inp is not None else got
        grads = {n: g for (n, _), g in zip(named, params, strict=True) if g is not None}
        self.gradients.add((key[0], part), key[1], grads)
        return got[0] if inp is not None else None

    def forward(self, key: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
        """Transformer stage: (B, T, d) → (B, T, d); keeps the graph for the backward.

        Raises:
            ProtocolError: ``key``'s forward ran already this attempt (a second copy of a FORWARD: the first
                one is kept, so a late copy cannot replace the activations a backward will use).
        """
        if key in self.forwarded:
            raise ProtocolError(f"microbatch {key[1]} of pipeline {key[0]} came twice this attempt")
        self.forwarded.add(key)
        t0 = self._start()
        x = x.requires_grad_()
        with torch.enable_grad():
            with self.autocast:
                y = self.module(x)
            y = y.float()  # fp32 on the wire (a no-op without autocast); the cast is part of the graph
        self.saved[key] = (x, y)
        self._count("forward", t0)
        return y.detach()

    def _take(self, key: tuple[int, int], grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The saved (input, output) of ``key``, removed; None if unknown.

        Raises:
            ProtocolError: ``grad``'s shape or dtype is not the saved output's (the entry is kept).
        """
        saved = self.saved.get(key)
        if saved is None:
            return None
        if grad.shape != saved[1].shape or grad.dtype != saved[1].dtype:
            raise ProtocolError(
                f"gradient of microbatch {key} is {tuple(grad.shape)} {grad.dtype}; expected "
                f"{tuple(saved[1].shape)} {saved[1].dtype}."
            )
        return self.saved.pop(key)

    def backward(self, key: tuple[int, int], grad: torch.Tensor) -> torch.Tensor | None:
        """Backward of a saved microbatch; returns the gradient w.r.t. its input (None if unknown key).

        Raises:
            ProtocolError: ``grad`` does not have the saved output's shape and dtype.
        """
        saved = self._take(key, grad)
        if saved is None:
            return None
        t0 = self._start()
        x, y = saved
        gx = self._backprop(key, 0, y, grad, x)
        self.microbatches += 1
        self._count("backward", t0)
        return gx

    # ---------------------------------------------------------------- stage 0 (embedding, head, loss)

    def embed(self, key: tuple[int, int], ids: torch.Tensor) -> torch.Tensor:
        """Stage 0: input ids (B, T) → hidden (B, T, d); keeps the graph."""
        t0 = self._start()
        ids = ids.to(self.device, non_blocking=True)
        with torch.enable_grad():
            with self.autocast:
                h = self.module.embed(ids)
            h = h.float()
        self.saved[key] = (ids, h)
        self._count("forward", t0)
        return h.detach()

    def head_loss(
        self, key: tuple[int, int], h: torch.Tensor, labels: torch.Tensor, mb_count: int
    ) -> tuple[float, torch.Tensor]:
        """Stage 0: hidden (B, T, d) of microbatch ``key`` → loss (nats, token mean) and the gradient w.r.t. ``h``
        of loss / mb_count (the head's parameter gradients go to :attr:`gradients`, part 1).

        Raises:
            ProtocolError: ``h``'s shape does not fit the labels.
            Rejected: (counter ``nonfinite``) the loss is NaN or infinite (finite but huge activations, e.g. a
                forged FORWARD that arrived first): nothing is back-propagated, so the head's gradients stay
                clean and the genuine activations of the microbatch are still taken when they arrive. The
                loss is read on the host anyway (it is reported), so the check costs no extra sync.
        """
        if h.shape[:2] != labels.shape:
            raise ProtocolError(
                f"final activations are {tuple(h.shape)}; expected {tuple(labels.shape)} x d."
            )
        t0 = self._start()
        h = h.requires_grad_()
        labels = labels.to(self.device, non_blocking=True)
        with torch.enable_grad():
            with self.autocast:
                loss = head_loss(self.module, h, labels, self.fused_loss)  # the simulator's function
            value = float(loss.detach())
            if not math.isfinite(value):
                self._count("backward", t0)
                raise Rejected(
                    f"the final activations give loss {value}; expected a finite loss", "nonfinite"
                )
            gh = self._backprop(key, 1, loss / mb_count, None, h)
        self._count("backward", t0)
        return value, gh

    def embed_backward(self, key: tuple[int, int], grad: torch.Tensor) -> bool:
        """Stage 0: finish a microbatch's backward through the embedding; False if unknown key.

        Raises:
            ProtocolError: ``grad`` does not have the embedding output's shape and dtype.
        """
        saved = self._take(key, grad)
        if saved is None:
            return False
        t0 = self._start()
        self._backprop(key, 0, saved[1], grad, None)
        self.microbatches += 1
        self._count("backward", t0)
        return True

    def _count(self, what: str, t0: float) -> None:
        if self.slowdown > 1.0:  # emulated slowness: the pass takes slowdown × its measured time
            time.sleep((self.slowdown - 1.0) * (time.perf_counter() - t0))
        seconds = time.perf_counter() - t0
        self.compute[f"{what}_s"] += seconds
        self.attempt_s += seconds
        cpu = time.thread_time()
        self.compute[f"{what}_cpu_s"] += cpu - self._cpu0
        self.compute[f"{what}_n"] += 1

    def _start(self) -> float:
        self._cpu0 = time.thread_time()
        return time.perf_counter()
