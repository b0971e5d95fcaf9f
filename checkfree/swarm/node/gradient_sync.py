"""Data-parallel gradient averaging between the serving replicas of one stage (docs/paper.md §8).

At ``sync`` each replica sends, for every pipeline it carries at its stage, that pipeline's gradient sum
(GRADIENTS, ``g.<param>``, ``pipeline``) to the other serving replicas of its stage. Once every pipeline's
contribution has arrived (exactly one per pipeline of the attempt, from the replica the routes give it:
checkfree.swarm.reroute.node_of) it sums them in pipeline order, so every replica gets bit-identical gradients
whichever node carried which pipeline (issue 39: a pipeline re-routed to a substitute mid-attempt adds the same
bits; while each replica carries its own pipeline, pipeline order is the replica-slot order of before), and
divides by the number of pipelines that contributed (total microbatches / ``mb_count``): **averaged, not
summed**. It then records the unclipped norm (CheckFree's ω, docs/paper.md §2), clips to ``grad_clip`` and
reports ``ready`` to the supervisor.

**Every replica is a possible attacker** (a volunteer's machine), and one replica's gradients enter every
replica's step: 3e38 in one of them made ω infinite, the clipped step NaN, and the whole stage NaN for the rest
of the run. So a replica's contribution is accepted only if

* its L2 norm ``‖g_r‖`` is finite (checked on arrival; NaN/inf, and finite values so large that the norm
  overflows float32, are refused), and a replica that ran no microbatch sends zeros;
* its norm per microbatch is at most :data:`GRAD_BOUND_K` × the *reference*: the lower median of the norms per
  microbatch of this round's contributions (this node's own included) from replicas that ran microbatches;
* its pipeline is one the routes give its sender at this stage (checked when the exchange reduces, once every
  ``reroute`` of the attempt has been taken here).

A refused contribution is dropped: the stage averages over the remaining replicas (their microbatches alone
count as pipelines), the node counts it (``rejected["gradients"]`` in its report) and names the replica in
``ready`` (``rejected``), which the supervisor writes to throughput.json (``rejected_gradients``). This node's
own gradients are never dropped. A replica's second GRADIENTS of one attempt is refused (the first is kept), except
that a contribution dropped on arrival may be replaced by a valid one (a forged copy must not block the
genuine one).

Why this bound (our choice; the paper's swarm trusts its replicas). ``K = 10``: honest replicas hold the same
weights and draw i.i.d. batches, so their norms per microbatch differ by small factors (the spread of
minibatch gradient noise), not by an order of magnitude; an attacker's contribution is held to ≤ 10 × an
honest one, and clipping (``grad_clip``) bounds the step. The reference is this round's contributions (the
"recent norms" are the current ones: N = the R replicas of the stage) rather than a history of past rounds
because (1) right after a recovery the rebuilt stage (a neighbour average or copy with a fresh Adam,
docs/paper.md §2) is far from the stage that was lost and its gradients can be many times those of the rounds
before, which a history would mistake for an attack by every honest replica; (2) a replacement starts with no
history, so replicas with different histories
would judge one contribution differently and their weights would drift apart, whereas every honest replica
computes the same norms from the same tensors and applies the same rule, so they still average to the same
gradients; (3) no warm-up rule is needed: the reference exists from the first iteration. The lower median
makes one attacker unable to move the reference up: with R = 2 it is the honest replica's norm, with R = 3
the smaller honest one. What it does not stop: a replica that stays within the bound (any direction, ≤ K × an
honest norm) or that sends different gradients to different replicas (they then drift apart); robust
aggregation (a coordinate-wise median) would be the next step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable

import torch

from checkfree.pipeline import clip_coefficient, grad_norm, scale_grads
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.reroute import node_of, pipelines
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

log = logging.getLogger(__name__)

GRAD_BOUND_K = 10.0
"""A replica's gradient norm per microbatch may be at most this × the round's reference (module docstring)."""

Contribution = tuple[dict[str, torch.Tensor], int, float]
"""A replica's gradients by parameter name, the microbatches it ran, and their L2 norm."""


def norm_of(tensors: Iterable[torch.Tensor]) -> float:
    """The L2 norm of all ``tensors`` together (0.0 for none); one host sync on a GPU. inf or NaN when a value
    is not finite or the values are too large for float32."""
    norms = [torch.linalg.vector_norm(t) for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def reference_norm(parts: dict[int, Contribution]) -> float | None:
    """The lower median of the finite norms per microbatch of the contributions that ran microbatches; None when
    none did."""
    per_mb = sorted(norm / mbs for _, mbs, norm in parts.values() if mbs > 0 and math.isfinite(norm))
    return per_mb[(len(per_mb) - 1) // 2] if per_mb else None


def over_bound(parts: dict[int, Contribution], own: int | set[int], k: float = GRAD_BOUND_K) -> list[int]:
    """The keys of ``parts`` (replicas, or pipelines; never ``own``, one key or a set of them) whose norm per
    microbatch exceeds ``k`` × :func:`reference_norm`."""
    ref = reference_norm(parts)
    if ref is None:
        return []
    mine = own if isinstance(own, set) else {own}
    return sorted(
        s for s, (_, mbs, norm) in parts.items() if s not in mine and mbs > 0 and norm / mbs > k * ref
    )


class GradientSync:
    """One node's side of the gradient exchange of the current attempt, one contribution per pipeline.

    Each pipeline of the attempt (its stage-0 nodes at ``begin``) is carried at this stage by one node
    (checkfree.swarm.reroute.node_of: its node of ``begin``, or a substitute after a re-route). That node sends
    the pipeline's chain sum (its microbatches in id order, checkfree.swarm.node.compute.OrderedGradients) to
    the other serving replicas, one GRADIENTS per pipeline (``pipeline``; a message without it stands for the
    sender's first pipeline); every replica adds the contributions in pipeline order, exactly one per pipeline,
    so the sum does not depend on which node carried which pipeline (issue 39; bit-identical to the replica-slot
    order while each replica carries its own pipeline).

    Args:
        ctx: this replica and its stage, its attempt and iteration, who serves its stage (``members``, and the
            ``begin``'s), and the ``send`` of GRADIENTS to the replicas and ``ready`` to the supervisor.
        state: the stage it trains (its module's ``.grad`` are averaged in place).
        cfg: the swarm config (``mb_count``, ``replicas``, ``model.grad_clip``).
        microbatches: how many microbatches this replica ran in the current attempt (with ``chains`` None).
        chains: this replica's per-pipeline sums of the attempt, pipeline → (name → tensor, microbatches)
            (checkfree.swarm.node.compute.StageWorker.settled); None: the module's ``.grad`` is the contribution of
            its first pipeline (tests of the exchange alone).
    """

    def __init__(
        self,
        ctx: NodeContext,
        state: StageState,
        cfg: SwarmConfig,
        microbatches: Callable[[], int],
        chains: Callable[[], dict[int, tuple[dict[str, torch.Tensor], int]]] | None = None,
    ) -> None:
        self.ctx, self.state, self.cfg, self.microbatches = ctx, state, cfg, microbatches
        self.chains = chains
        self.received: dict[tuple[int, int], Contribution] = {}
        """(replica node id, pipeline) → its accepted contribution of the current attempt."""
        self.dropped: dict[tuple[int, int], str] = {}
        """(replica node id, pipeline) → why that contribution of the current attempt was dropped."""
        self.rejected_count = 0
        """Contributions dropped since the node started (non-finite, over the bound, not its pipeline)."""
        self.attempt = -1
        """The attempt whose ``sync`` this node has started; -1 when none is under way."""
        self.norm = 1.0
        """The unclipped norm of the last averaged gradients (ω of the step that follows)."""
        self.reduced = -1
        """The attempt whose gradients were averaged and reported ``ready`` (a ``commit`` needs it); -1: none."""

    def reset(self) -> None:
        """Forget the attempt's gradients (a new attempt began, or it was aborted)."""
        self.received.clear()
        self.dropped.clear()
        self.attempt = -1
        self.reduced = -1

    def replicas(self) -> list[int]:
        """The other serving replicas of this node's stage."""
        return [n for n in self.ctx.membership.serving(self.ctx.stage) if n != self.ctx.node_id]

    def owners(self) -> dict[int, int | None]:
        """Pipeline → the serving replica of this stage that carries it (checkfree.swarm.reroute.node_of)."""
        members, stage = self.ctx.membership, self.ctx.stage
        begun, now = members.at_begin(), members.members
        return {p: node_of(p, stage, begun, now) for p in range(pipelines(begun, stage))}

    def _own(self) -> dict[int, tuple[dict[str, torch.Tensor], int]]:
        """This replica's contributions: each pipeline it carries → (a gradient for every parameter, zeros where
        none came; microbatches)."""
        me = self.ctx.node_id
        mine = [p for p, o in self.owners().items() if o == me]
        params = dict(self.state.module.named_parameters())
        if self.chains is None:
            grads = {n: p.grad for n, p in params.items() if p.grad is not None}
            sums = {mine[0]: (grads, self.microbatches())} if mine else {}
        else:
            sums = self.chains()
        out = {}
        for p in mine:
            grads, mbs = sums.get(p, ({}, 0))
            out[p] = ({n: grads[n] if n in grads else torch.zeros_like(t) for n, t in params.items()}, mbs)
        return out

    def start(self) -> None:
        """``sync``: send this replica's contributions (one per pipeline it carries) to the others, then reduce
        if they are all in."""
        clock = self.ctx.clock
        self.attempt = clock.attempt
        own = self._own()
        for peer in self.replicas():
            for pipeline, (grads, mbs) in own.items():
                self.ctx.send(
                    peer,
                    MessageType.GRADIENTS,
                    clock.iteration,
                    -1,
                    {"attempt": clock.attempt, "microbatches": mbs, "pipeline": pipeline},
                    {f"g.{n}": g for n, g in grads.items()},
                )
        self._try_reduce()

    def on_gradients(self, msg: Message) -> None:
        """Keep a replica's contribution of one pipeline of the current attempt, if the routes give that pipeline
        to the sender: checked on arrival once this node's ``sync`` came (every ``reroute`` of the attempt is
        taken by then), else when the exchange reduces (a ``reroute`` may still be on its way here).

        Raises:
            ProtocolError: the sender is not a serving replica of this stage, the pipeline is not one of the
                attempt's (or, without ``pipeline``, the sender carries none), the routes give it another replica
                (known once this node's ``sync`` came), it sent this pipeline's gradients of
                this attempt already, a gradient is missing, extra, of the wrong shape or dtype, the microbatch
                count is implausible, or (the contribution is then dropped: the stage averages without it unless
                a valid copy follows) the norm is not finite (NaN/inf) or a contribution of no microbatch is not
                zero. The node drops the message and counts it.
        """
        sender = msg.sender
        if msg.meta["stage"] != self.ctx.stage or sender not in self.replicas():
            raise ProtocolError(f"gradients of stage {msg.meta['stage']} from {sender}, not a replica")
        if self.ctx.clock.attempt_of(msg) is None:
            return
        owners = self.owners()
        pipeline = msg.meta.get("pipeline")
        if pipeline is None:
            theirs = [p for p, o in owners.items() if o == sender]
            if not theirs:
                raise ProtocolError(f"gradients from node {sender}, which carries no pipeline")
            pipeline = theirs[0]
        if pipeline not in owners:
            raise ProtocolError(f"gradients of pipeline {pipeline}; the attempt has {len(owners)}")
        key = (sender, pipeline)
        if self.attempt == self.reduced == -1 or owners[pipeline] == sender:
            pass  # before this node's ``sync`` a ``reroute`` may still be on its way: checked at the reduce
        else:  # this node's ``sync`` came, after every ``reroute`` of the attempt: the routes are final
            raise ProtocolError(
                f"gradients of pipeline {pipeline} from node {sender}, which does not carry it"
            )
        if key in self.received:
            raise ProtocolError(
                f"gradients of pipeline {pipeline} of attempt {msg.meta['attempt']} from node {sender} came twice"
            )
        grads = W.split(msg.tensors, "g")
        params = dict(self.state.module.named_parameters())
        if grads.keys() != params.keys() or len(grads) != len(msg.tensors):
            raise ProtocolError(f"gradients name {sorted(set(grads) ^ set(params))[:3]} wrongly")
        for name, p in params.items():
            if grads[name].shape != p.shape or grads[name].dtype != p.dtype:
                raise ProtocolError(
                    f"gradient {name!r} is {tuple(grads[name].shape)}; expected {tuple(p.shape)}"
                )
        mbs = msg.meta["microbatches"]
        if mbs > self.cfg.mb_count:
            raise ProtocolError(f"{mbs} microbatches of one pipeline is implausible")
        norm = norm_of(grads.values())
        if not math.isfinite(norm) or (mbs == 0 and norm > 0):
            why = (
                f"norm {norm}: NaN or inf values, or values too large for float32"
                if not math.isfinite(norm)
                else f"norm {norm:.3g} from a replica that ran no microbatch"
            )
            self._drop(key, why)
            self._try_reduce()
            raise ProtocolError(f"gradients from node {sender} dropped: {why}; expected finite gradients")
        self.dropped.pop(key, None)  # a valid copy replaces one dropped on arrival
        self.received[key] = (grads, mbs, norm)
        self._try_reduce()

    def _drop(self, key: tuple[int, int], why: str) -> None:
        self.dropped[key] = why
        self.rejected_count += 1
        log.warning(
            "node %d: stage %d averages without node %d's gradients of pipeline %d of attempt %d: %s",
            self.ctx.node_id,
            self.ctx.stage,
            key[0],
            key[1],
            self.ctx.clock.attempt,
            why,
        )

    def _try_reduce(self) -> None:
        """Average the accepted contributions once every pipeline's is in (pipeline order), norm, clip, report
        ready (with the replicas whose contributions were dropped)."""
        attempt, module = self.ctx.clock.attempt, self.state.module
        if self.attempt != attempt:
            return
        me = self.ctx.node_id
        owners = self.owners()
        theirs = {(o, p) for p, o in owners.items() if o is not None and o != me}
        if not theirs <= set(self.received) | set(self.dropped):
            return
        for key in sorted(set(self.received) - theirs):  # a pipeline the routes do not give its sender
            del self.received[key]
            self._drop(key, f"pipeline {key[1]} is not carried by node {key[0]} at this stage")
        own = self._own()
        parts: dict[int, Contribution] = {
            p: (g, mbs, norm_of(g.values()) if self.received else 0.0) for p, (g, mbs) in own.items()
        }  # alone: nothing to compare (no sync)
        sender = {p: me for p in own} | {p: s for s, p in self.received}
        parts |= {p: self.received[(s, p)] for s, p in self.received}
        ref = reference_norm(parts)
        for p in over_bound(parts, set(own)):
            norm, mbs = parts[p][2], parts[p][1]
            self._drop(
                (sender[p], p),
                f"norm per microbatch {norm / mbs:.3g} > {GRAD_BOUND_K:g} x reference {ref:.3g}",
            )
            del parts[p]
        total_mbs = sum(mbs for _, mbs, _ in parts.values())
        pipelines_in = max(total_mbs / self.cfg.mb_count, 1e-12) if total_mbs else 1.0
        with torch.no_grad():
            for name, prm in module.named_parameters():
                acc = torch.zeros_like(prm)
                for p in sorted(parts):  # pipeline order, never arrival or node order
                    acc += parts[p][0][name]
                prm.grad = acc / pipelines_in
        self.norm = grad_norm(module)
        scale_grads(module, clip_coefficient(self.norm, self.cfg.model.grad_clip))
        self.attempt = -1
        self.reduced = attempt
        dropped = sorted({s for s, _ in self.dropped})
        extra = {"rejected": dropped} if dropped else {}
        self.ctx.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            self.ctx.clock.iteration,
            meta=control("ready", attempt=attempt, grad_norm=self.norm, pipelines=pipelines_in, **extra),
        )
