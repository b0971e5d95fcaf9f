"""A transformer stage's side of the pipeline: FORWARD in → its blocks → FORWARD on; BACKWARD in → BACKWARD back.

Every FORWARD / BACKWARD carries its route (one node per stage, in the order the microbatch visits them:
checkfree.swarm.config.route) and the position on it. :func:`check_pipeline_message` checks a message before any
node uses it (stage 0's checkfree.swarm.node.driver too); :class:`StageRelay` runs this node's stage on it and
sends the result to the next (forward) or previous (backward) node of the route.
"""

from __future__ import annotations

import torch

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.compute import StageWorker
from checkfree.swarm.node.context import NodeContext
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

Key = tuple[int, int]
"""(pipeline, microbatch): a microbatch of one iteration."""


def check_pipeline_message(msg: Message, cfg: SwarmConfig) -> tuple[list[int], int, Key, torch.Tensor]:
    """The route, position, key and tensor of a FORWARD (``activations``) or BACKWARD (``gradients``).

    The tensor is (B, T, dmodel) float32 with B ≤ batch_size and T ≤ seq_l.

    Raises:
        ProtocolError: the tensor's shape or dtype, or the route's length or position, does not fit.
    """
    route, pos, pipeline = msg.meta["route"], msg.meta["pos"], msg.meta["pipeline"]
    tensor = msg.tensors["activations" if msg.type == MessageType.FORWARD else "gradients"]
    m = cfg.model
    if (
        tensor.dtype != torch.float32
        or tensor.dim() != 3
        or tensor.shape[-1] != m.dmodel
        or not 0 < tensor.shape[0] <= m.batch_size
        or not 0 < tensor.shape[1] <= m.seq_l
    ):
        raise ProtocolError(
            f"tensor is {tuple(tensor.shape)} {tensor.dtype}; expected (<= {m.batch_size}, <= {m.seq_l}, "
            f"{m.dmodel}) float32"
        )
    if not 0 <= pos <= len(route) or len(route) != cfg.n_stages + 1:
        raise ProtocolError(f"route {route[:8]} position {pos} does not fit {cfg.n_stages} stages")
    return route, pos, (pipeline, msg.microbatch), tensor


class StageRelay:
    """Runs a transformer stage's forward and backward for the microbatches routed through this node.

    Args:
        ctx: this node (it must sit at the message's route position), the epoch and iteration the outgoing
            messages carry, and the ``send`` of the FORWARD / BACKWARD on.
        worker: the stage's forward/backward with saved activations per (pipeline, microbatch).
    """

    def __init__(self, ctx: NodeContext, worker: StageWorker) -> None:
        self.ctx, self.worker = ctx, worker

    def on_message(self, msg: Message, route: list[int], pos: int, key: Key, tensor: torch.Tensor) -> None:
        """Forward or back-propagate one checked message (:func:`check_pipeline_message`).

        Raises:
            ProtocolError: this node is not at the route position, or a BACKWARD has no saved forward.
        """
        ctx = self.ctx
        if pos >= len(route) or route[pos] != ctx.node_id or pos == 0:
            raise ProtocolError(f"route position {pos} of {route[:8]} is not this node")
        meta = {"epoch": ctx.clock.epoch, "route": route, "pipeline": key[0]}
        iteration = ctx.clock.iteration
        if msg.type == MessageType.FORWARD:
            out = self.worker.forward(key, tensor)
            nxt = pos + 1
            ctx.send(
                route[nxt % len(route)],
                MessageType.FORWARD,
                iteration,
                msg.microbatch,
                {**meta, "pos": nxt},
                {"activations": out},
            )
        else:
            grad = self.worker.backward(key, tensor)
            if grad is None:
                raise ProtocolError(f"no saved forward for pipeline {key[0]} microbatch {key[1]}")
            ctx.send(
                route[pos - 1],
                MessageType.BACKWARD,
                iteration,
                msg.microbatch,
                {**meta, "pos": pos - 1},
                {"gradients": grad},
            )
