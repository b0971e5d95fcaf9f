"""Data-parallel gradient averaging between the serving replicas of one stage (docs/paper.md §8).

At ``sync`` each replica sends its accumulated gradients (GRADIENTS, ``g.<param>``) to the other serving
replicas of its stage. Once every one has arrived it sums all of them in node-id order, so every replica gets
bit-identical gradients, and divides by the number of pipelines that contributed (total microbatches /
``mb_count``; = the number of replicas when each serves one pipeline): **averaged, not summed**. It then records
the unclipped norm (CheckFree's ω, docs/paper.md §2), clips to ``grad_clip`` and reports ``ready`` to the supervisor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from checkfree.pipeline import clip_coefficient, grad_norm, scale_grads
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError


class GradientSync:
    """One node's side of the gradient exchange of the current epoch.

    Args:
        ctx: this replica and its stage, its epoch and iteration, who serves its stage (``members``), and the
            ``send`` of GRADIENTS to the replicas and ``ready`` to the supervisor.
        state: the stage it trains (its module's ``.grad`` are averaged in place).
        cfg: the swarm config (``mb_count``, ``replicas``, ``model.grad_clip``).
        microbatches: how many microbatches this replica ran in the current epoch.
    """

    def __init__(
        self, ctx: NodeContext, state: StageState, cfg: SwarmConfig, microbatches: Callable[[], int]
    ) -> None:
        self.ctx, self.state, self.cfg, self.microbatches = ctx, state, cfg, microbatches
        self.received: dict[int, tuple[dict[str, torch.Tensor], int]] = {}
        """replica node id → (gradients by parameter name, microbatches it ran)."""
        self.epoch = -1
        """The epoch whose ``sync`` this node has started; -1 when none is under way."""
        self.norm = 1.0
        """The unclipped norm of the last averaged gradients (ω of the step that follows)."""
        self.reduced = -1
        """The epoch whose gradients were averaged and reported ``ready`` (a ``commit`` needs it); -1: none."""

    def reset(self) -> None:
        """Forget the epoch's gradients (a new epoch began, or it was aborted)."""
        self.received.clear()
        self.epoch = -1
        self.reduced = -1

    def replicas(self) -> list[int]:
        """The other serving replicas of this node's stage."""
        return [n for n in self.ctx.membership.serving(self.ctx.stage) if n != self.ctx.node_id]

    def start(self) -> None:
        """``sync``: send this replica's gradients to the others, then reduce if they are all in."""
        clock = self.ctx.clock
        self.epoch = clock.epoch
        grads = W.grad_tensors(self.state.module)
        for peer in self.replicas():
            self.ctx.send(
                peer,
                MessageType.GRADIENTS,
                clock.iteration,
                -1,
                {"epoch": clock.epoch, "microbatches": self.microbatches()},
                grads,
            )
        self._try_reduce()

    def on_gradients(self, msg: Message) -> None:
        """Keep a replica's gradients of the current epoch.

        Raises:
            ProtocolError: the sender is not a serving replica of this stage, a gradient is missing, extra,
                of the wrong shape or dtype, or not finite, or the microbatch count is implausible (the node
                drops the message and counts it).
        """
        if msg.meta["stage"] != self.ctx.stage or msg.sender not in self.replicas():
            raise ProtocolError(f"gradients of stage {msg.meta['stage']} from {msg.sender}, not a replica")
        if self.ctx.clock.epoch_of(msg) is None:
            return
        grads = W.split(msg.tensors, "g")
        params = dict(self.state.module.named_parameters())
        if grads.keys() != params.keys() or len(grads) != len(msg.tensors):
            raise ProtocolError(f"gradients name {sorted(set(grads) ^ set(params))[:3]} wrongly")
        for name, p in params.items():
            if grads[name].shape != p.shape or grads[name].dtype != p.dtype:
                raise ProtocolError(
                    f"gradient {name!r} is {tuple(grads[name].shape)}; expected {tuple(p.shape)}"
                )
        W.check_finite(grads, f"node {msg.sender}")
        if msg.meta["microbatches"] > self.cfg.mb_count * self.cfg.replicas:
            raise ProtocolError(f"{msg.meta['microbatches']} microbatches is implausible")
        self.received[msg.sender] = (grads, msg.meta["microbatches"])
        self._try_reduce()

    def _try_reduce(self) -> None:
        """Average the replicas' gradients once all arrived (node-id order), norm, clip, report ready."""
        epoch, module = self.ctx.clock.epoch, self.state.module
        if self.epoch != epoch or not set(self.replicas()) <= set(self.received):
            return
        params = dict(module.named_parameters())
        own = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
        parts = dict(self.received) | {self.ctx.node_id: (own, self.microbatches())}
        total_mbs = sum(mbs for _, mbs in parts.values())
        pipelines = max(total_mbs / self.cfg.mb_count, 1e-12) if total_mbs else 1.0
        with torch.no_grad():
            for name, p in params.items():
                acc = torch.zeros_like(p)
                for sender in sorted(parts):
                    acc += parts[sender][0][name]
                p.grad = acc / pipelines
        self.norm = grad_norm(module)
        scale_grads(module, clip_coefficient(self.norm, self.cfg.model.grad_clip))
        self.epoch = -1
        self.reduced = epoch
        self.ctx.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            self.ctx.clock.iteration,
            meta=control("ready", epoch=epoch, grad_norm=self.norm, pipelines=pipelines),
        )
