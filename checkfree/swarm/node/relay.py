"""A transformer stage's side of the pipeline: FORWARD in → its blocks → FORWARD on; BACKWARD in → BACKWARD back.

Every FORWARD / BACKWARD carries its route (one node per stage, in the order the microbatch visits them:
checkfree.swarm.config.route) and the position on it. Every swarm member is a possible attacker (a
volunteer's machine), so a node checks a message before it uses it (stage 0's checkfree.swarm.node.driver
too), in two steps:

1. :func:`check_pipeline_message`, on the bytes as received (before they go to a GPU: no device sync): the
   tensor's shape and dtype, the route's length and position, and that every value is finite
   (``Rejected``, counter ``nonfinite``).
2. :func:`check_route`, once the message's attempt is the node's (its ``begin`` brought the attempt's serving
   replicas): the route is the one that attempt assigns to that pipeline and microbatch (the same
   checkfree.swarm.config.route stage 0 used), this node is at the position, and the sender is the node the
   route puts before it (FORWARD) or after it (BACKWARD) (``Rejected``, counter ``off_route``).

A rejected message is dropped and counted (checkfree.swarm.node.node); nothing else happens to it. The
genuine message of that microbatch still arrives from its real neighbour; if none does (the neighbour itself
sent the bad one), the microbatch is lost like any other: stage 0 reports ``stalled`` after
``microbatch_timeout`` and the supervisor aborts and redoes the iteration (checkfree.swarm.node.driver).
:class:`StageRelay` runs this node's stage on an accepted message and sends the result to the next (forward)
or previous (backward) node of the route.
"""

from __future__ import annotations

import torch

from checkfree.config import Config
from checkfree.pipeline import stage_order
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.compute import StageWorker
from checkfree.swarm.node.context import NodeContext
from checkfree.swarm.reroute import stable_route
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError, Rejected, all_finite

Key = tuple[int, int]
"""(pipeline, microbatch): a microbatch of one iteration."""


def check_activation_shape(tensor: torch.Tensor, model: Config, what: str) -> None:
    """Check that ``tensor`` is one microbatch's activations (or their gradients) between two stages of
    ``model``: (B, T, dmodel) float32 with 0 < B ≤ batch_size and 0 < T ≤ seq_l. The tensors of FORWARD and
    BACKWARD (:func:`check_pipeline_message`) and of VALIDATION (checkfree.swarm.node.validation
    .check_validation_message) messages are all checked by it.

    Raises:
        ProtocolError: the shape or dtype does not fit (one sentence naming ``what``).
    """
    if (
        tensor.dtype != torch.float32
        or tensor.dim() != 3
        or tensor.shape[-1] != model.dmodel
        or not 0 < tensor.shape[0] <= model.batch_size
        or not 0 < tensor.shape[1] <= model.seq_l
    ):
        raise ProtocolError(
            f"{what} is {tuple(tensor.shape)} {tensor.dtype}; expected (<= {model.batch_size}, <= {model.seq_l}, "
            f"{model.dmodel}) float32"
        )


def check_pipeline_message(msg: Message, cfg: SwarmConfig) -> tuple[list[int], int, Key, torch.Tensor]:
    """The route, position, key and tensor of a FORWARD (``activations``) or BACKWARD (``gradients``).

    The tensor is (B, T, dmodel) float32 with B ≤ batch_size and T ≤ seq_l, and every value finite. Call it on
    the received host tensor: on the CPU the finiteness check is one ``aminmax`` pass
    (checkfree.swarm.wire.protocol.all_finite), and a GPU node pays no device sync for it.

    Raises:
        ProtocolError: the tensor's shape or dtype, or the route's length or position, does not fit.
        Rejected: (counter ``nonfinite``) the tensor holds a NaN or an infinity.
    """
    route, pos, pipeline = msg.meta["route"], msg.meta["pos"], msg.meta["pipeline"]
    tensor = msg.tensors["activations" if msg.type == MessageType.FORWARD else "gradients"]
    check_activation_shape(tensor, cfg.model, "tensor")
    if not 0 <= pos <= len(route) or len(route) != cfg.n_stages + 1:
        raise ProtocolError(f"route {route[:8]} position {pos} does not fit {cfg.n_stages} stages")
    if not all_finite(tensor):
        raise Rejected(
            f"{msg.type.name} of microbatch {msg.microbatch} (pipeline {pipeline}) holds NaN or inf; expected "
            "finite values",
            "nonfinite",
        )
    return route, pos, (pipeline, msg.microbatch), tensor


def check_route(
    msg: Message,
    path: list[int],
    pos: int,
    cfg: SwarmConfig,
    members: dict[int, list[int]],
    swaps: bool,
    me: int,
    begun: dict[int, list[int]] | None = None,
) -> None:
    """Check that a FORWARD / BACKWARD (:func:`check_pipeline_message` passed) comes from the node its route
    assigns, on the route the current attempt assigns.

    Args:
        msg: the message; ``path`` and ``pos``: its route and position.
        cfg: the swarm config (stages, microbatches).
        members: the attempt's serving replicas per stage (its ``begin``'s, less the nodes a ``reroute`` took).
        swaps: CheckFree+ stage order on odd microbatches (checkfree.pipeline.stage_order).
        me: this node's id.
        begun: the serving replicas of the attempt's ``begin`` (None: ``members``, no re-route): each pipeline
            keeps its nodes of ``begin`` that still serve (checkfree.swarm.reroute.stable_route), so after a
            re-route a message on the old route of a pipeline that moved is refused, the others' still pass.

    Raises:
        Rejected: (counter ``off_route``) the microbatch index is out of range, the route is not
            ``stable_route(pipeline, begun, members, S, stage_order(microbatch, S, swaps))``, the position is not
            this node,
            or the sender is not the node before this one on the route (FORWARD: ``path[pos − 1]``) or after it
            (BACKWARD: ``path[(pos + 1) mod len]``, stage 0 for the last stage).
    """
    pipeline, mb, n = msg.meta["pipeline"], msg.microbatch, len(path)
    what = f"{msg.type.name} of microbatch {mb} (pipeline {pipeline}) from node {msg.sender}"
    if not 0 <= mb < cfg.mb_count:
        raise Rejected(f"{what}: microbatch {mb} is outside 0..{cfg.mb_count - 1}", "off_route")
    order = stage_order(mb, cfg.n_stages, swaps)
    want = stable_route(pipeline, members if begun is None else begun, members, cfg.n_stages, order)
    if want is None or path != want:
        raise Rejected(f"{what}: route {path[:8]} is not this attempt's route {want}", "off_route")
    forward = msg.type == MessageType.FORWARD
    if not (1 <= pos <= n if forward else 0 <= pos < n) or path[pos % n] != me:
        raise Rejected(f"{what}: position {pos} of route {path[:8]} is not node {me}", "off_route")
    sender = path[pos - 1] if forward else path[(pos + 1) % n]
    if msg.sender != sender:
        raise Rejected(f"{what}: the route assigns node {sender} to send it", "off_route")


class StageRelay:
    """Runs a transformer stage's forward and backward for the microbatches routed through this node.

    Args:
        ctx: this node (it must sit at the message's route position), the attempt and iteration the outgoing
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
        meta = {
            "attempt": ctx.clock.attempt,
            "route": route,
            "pipeline": key[0],
            "reroutes": ctx.clock.reroutes,
        }
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
