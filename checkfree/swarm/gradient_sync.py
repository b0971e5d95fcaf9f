"""Data-parallel gradient averaging between the serving replicas of one stage (SPEC §8).

At ``sync`` each replica sends its accumulated gradients (GRADIENTS, ``g.<param>``) to the other serving
replicas of its stage. Once every one has arrived it sums all of them in node-id order, so every replica gets
bit-identical gradients, and divides by the number of pipelines that contributed (total microbatches /
``mb_count``; = the number of replicas when each serves one pipeline): **averaged, not summed**. It then records
the unclipped norm (CheckFree's ω, SPEC §2), clips to ``grad_clip`` and reports ``ready`` to the supervisor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from checkfree.pipeline import clip_coefficient, grad_norm, scale_grads
from checkfree.swarm import weights as W
from checkfree.swarm.control import control
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

if TYPE_CHECKING:
    from checkfree.swarm.node import Node


class GradientSync:
    """One node's side of the gradient exchange of the current epoch."""

    def __init__(self, node: Node) -> None:
        self.node = node
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
        node = self.node
        return [n for n in node.members.get(node.stage, []) if n != node.id]

    def start(self) -> None:
        """``sync``: send this replica's gradients to the others, then reduce if they are all in."""
        node = self.node
        self.epoch = node.epoch
        grads = W.grad_tensors(node.module)
        for peer in self.replicas():
            node.send(
                peer,
                MessageType.GRADIENTS,
                node.iteration,
                -1,
                {"epoch": node.epoch, "microbatches": node.worker.microbatches},
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
        node = self.node
        if msg.meta["stage"] != node.stage or msg.sender not in self.replicas():
            raise ProtocolError(f"gradients of stage {msg.meta['stage']} from {msg.sender}, not a replica")
        if node.epoch_of(msg) is None:
            return
        grads = W.split(msg.tensors, "g")
        params = dict(node.module.named_parameters())
        if grads.keys() != params.keys() or len(grads) != len(msg.tensors):
            raise ProtocolError(f"gradients name {sorted(set(grads) ^ set(params))[:3]} wrongly")
        for name, p in params.items():
            if grads[name].shape != p.shape or grads[name].dtype != p.dtype:
                raise ProtocolError(
                    f"gradient {name!r} is {tuple(grads[name].shape)}; expected {tuple(p.shape)}"
                )
        W.check_finite(grads, f"node {msg.sender}")
        if msg.meta["microbatches"] > node.cfg.mb_count * node.cfg.replicas:
            raise ProtocolError(f"{msg.meta['microbatches']} microbatches is implausible")
        self.received[msg.sender] = (grads, msg.meta["microbatches"])
        self._try_reduce()

    def _try_reduce(self) -> None:
        """Average the replicas' gradients once all arrived (node-id order), norm, clip, report ready."""
        node = self.node
        if self.epoch != node.epoch or not set(self.replicas()) <= set(self.received):
            return
        params = dict(node.module.named_parameters())
        own = {n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in params.items()}
        parts = dict(self.received) | {node.id: (own, node.worker.microbatches)}
        total_mbs = sum(mbs for _, mbs in parts.values())
        pipelines = max(total_mbs / node.cfg.mb_count, 1e-12) if total_mbs else 1.0
        with torch.no_grad():
            for name, p in params.items():
                acc = torch.zeros_like(p)
                for sender in sorted(parts):
                    acc += parts[sender][0][name]
                p.grad = acc / pipelines
        self.norm = grad_norm(node.module)
        scale_grads(node.module, clip_coefficient(self.norm, node.model_cfg.grad_clip))
        self.epoch = -1
        self.reduced = node.epoch
        node.send(
            SUPERVISOR_ID,
            MessageType.CONTROL,
            node.iteration,
            meta=control("ready", epoch=node.epoch, grad_norm=self.norm, pipelines=pipelines),
        )
