"""A node's side of a validation of the pipeline: the model config's fixed validation batches, forward only.

Every ``eval_interval`` iterations, and at iteration 0 and at the end as the simulator does
(checkfree.sim.trainer ``Trainer.evaluate``), the supervisor sends the serving nodes CONTROL ``evaluate`` between
two attempts: the evaluation's number (increasing), the iteration (the weights' version) and the serving replicas
of every stage (checkfree.swarm.supervisor.validation). Stage-0 node p of the P serving ones takes validation
batches p, p + P, … (checkfree.swarm.node.compute.validation_batches_for: the simulator's for the model config),
embeds each and sends it as VALIDATION along pipeline p's route with the stages in order (no CheckFree+ swaps, as
the simulator validates); each transformer stage runs its blocks on it and sends it on; back at stage 0, the head
gives the batch's token-mean cross-entropy (nats). At most ``in_flight`` batches of a pipeline are out. Nothing is
kept for a backward (``torch.no_grad``), nothing is back-propagated, no optimizer steps: the weights are the last
commit's. When its batches are back, stage 0 reports ``evaluated`` (the sum of its batches' losses and their
number); the supervisor averages over every batch, as the simulator does.

A VALIDATION passes the data plane's checks as a FORWARD does (checkfree.swarm.node.relay): shape and dtype, and
finite values on the received host bytes (``Rejected``, counter ``nonfinite``), then the route the evaluation
assigns to that pipeline, this node at the position and the sender before it (``Rejected``, counter
``off_route``). One of an evaluation that has not begun here yet waits in a bounded buffer (its ``evaluate`` may
still be on its way over the supervisor's link); one of an older evaluation is dropped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from checkfree.data.spec import default_cache_dir
from checkfree.loss import head_loss
from checkfree.swarm.config import SwarmConfig, route
from checkfree.swarm.devices import autocast_for
from checkfree.swarm.node.compute import validation_batches_for
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.relay import check_activation_shape
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import (
    SUPERVISOR_ID,
    Message,
    MessageType,
    ProtocolError,
    Rejected,
    all_finite,
)

log = logging.getLogger(__name__)

EARLY_MESSAGES = 256
"""VALIDATION messages of an evaluation not begun here yet, kept at most (64 per sender)."""
EARLY_BYTES = 256 * 1024**2
"""Their tensor bytes at most."""


def in_order(n_stages: int) -> list[int]:
    """The transformer stages a validation batch visits: 1 … S (the simulator's ``evaluate``: no swaps)."""
    return list(range(1, n_stages + 1))


def check_validation_message(msg: Message, cfg: SwarmConfig) -> tuple[list[int], int, int, torch.Tensor]:
    """The route, position, pipeline and activations of a VALIDATION, checked on the received host tensor.

    The tensor is (B, T, dmodel) float32 with B ≤ batch_size and T ≤ seq_l, every value finite; the batch index
    (the header's microbatch) is one of the model config's ``validation`` batches.

    Raises:
        ProtocolError: the shape, dtype, batch index, or the route's length or position does not fit.
        Rejected: (counter ``nonfinite``) the activations hold a NaN or an infinity.
    """
    path, pos, pipeline = msg.meta["route"], msg.meta["pos"], msg.meta["pipeline"]
    tensor, m = msg.tensors["activations"], cfg.model
    check_activation_shape(tensor, m, "the validation batch's activations")
    if not 0 <= msg.microbatch < m.validation:
        raise ProtocolError(f"validation batch {msg.microbatch} is outside 0..{m.validation - 1}")
    if len(path) != cfg.n_stages + 1 or not 1 <= pos <= len(path):
        raise ProtocolError(f"route {path[:8]} position {pos} does not fit {cfg.n_stages} stages")
    if not all_finite(tensor):
        raise Rejected(
            f"VALIDATION of batch {msg.microbatch} (pipeline {pipeline}) holds NaN or inf; expected finite values",
            "nonfinite",
        )
    return path, pos, pipeline, tensor


class NodeValidation:
    """This node's part in the validations: stage 0 drives its share of the batches, a transformer stage relays.

    Args:
        ctx: this node (id, stage) and the ``send`` of VALIDATION and ``evaluated``.
        cfg: the swarm config (stages, in-flight limit, the model config's validation batches and shapes).
        state: the stage replica (its module is read at each use: a rollback replaces the weights in place).
        serving: whether this node serves (one that still recovers is in no evaluation).
        dispatch: routes a message again (an early VALIDATION, once its ``evaluate`` arrived).
        to_device: a received message's tensors on this node's device (checkfree.swarm.wire.staging).
        batches: stage 0's loader of the validation batches (called at its first evaluation); None elsewhere.
    """

    def __init__(
        self,
        ctx: NodeContext,
        cfg: SwarmConfig,
        state: StageState,
        serving: Callable[[], bool],
        dispatch: Callable[[Message], None],
        to_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
        batches: Callable[[], list[torch.Tensor]] | None = None,
    ) -> None:
        self.ctx, self.cfg, self.state, self.serving = ctx, cfg, state, serving
        self.dispatch, self.to_device, self.load_batches = dispatch, to_device, batches
        self.batches: list[torch.Tensor] | None = None
        self.evaluation = -1
        """The number of the last ``evaluate`` (-1: none yet)."""
        self.iteration = -1
        self.members: dict[int, list[int]] = {}
        self.early = FutureBuffer(EARLY_MESSAGES, EARLY_BYTES, per_sender=64)
        self._clear()

    def _clear(self) -> None:
        self.pipeline = -1
        self.queue: list[int] = []
        """Stage 0: the batches of its share not sent yet."""
        self.out: dict[int, torch.Tensor] = {}
        """Stage 0: batch → its labels (B, T), while the batch is out."""
        self.loss_sum, self.count, self.diverged = 0.0, 0, False

    @classmethod
    def for_node(
        cls,
        ctx: NodeContext,
        cfg: SwarmConfig,
        state: StageState,
        vocab_size: int,
        cache_dir: Path | None,
        serving: Callable[[], bool],
        dispatch: Callable[[Message], None],
        to_device: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    ) -> NodeValidation:
        """The validation part of node ``ctx``: a stage-0 node loads the validation batches of ``cfg.data``."""
        batches = None
        if ctx.stage == 0:
            where = cache_dir or default_cache_dir()

            def batches() -> list[torch.Tensor]:
                return validation_batches_for(cfg.model, cfg.data, vocab_size, where)

        return cls(ctx, cfg, state, serving, dispatch, to_device, batches)

    def table(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """CONTROL command → handler."""
        return {"evaluate": self.begin}

    # ------------------------------------------------------------------ the supervisor's command

    def begin(self, meta: dict[str, Any]) -> None:
        """CONTROL ``evaluate``: a new evaluation; stage 0 sends the first ``in_flight`` batches of its share.

        Raises:
            ProtocolError: the evaluation is not newer than this node's last.
        """
        number = meta["evaluation"]
        if number <= self.evaluation:
            raise ProtocolError(f"evaluate {number}; this node is at evaluation {self.evaluation} already")
        self.evaluation, self.iteration = number, meta["iteration"]
        self.members = {int(k): list(v) for k, v in meta["members"].items()}
        self._clear()
        self.early.take(lambda m: m.meta["evaluation"] < number)  # an older evaluation's: gone
        stage0 = self.members.get(0, [])
        if self.load_batches is not None and self.serving() and self.ctx.node_id in stage0:
            if self.batches is None:
                self.batches = self.load_batches()
            self.pipeline = stage0.index(self.ctx.node_id)
            self.queue = list(range(self.pipeline, len(self.batches), len(stage0)))
            self._pump()
        for msg in self.early.take(lambda m: m.meta["evaluation"] == number):
            self.dispatch(msg)

    # ------------------------------------------------------------------ messages

    def on_message(self, msg: Message) -> None:
        """A VALIDATION: checked, kept if its evaluation is ahead, then run through this stage (or, back at stage 0,
        through the head and the loss).

        Raises:
            ProtocolError, Rejected: the checks of :func:`check_validation_message` and of the route.
        """
        path, pos, pipeline, tensor = check_validation_message(msg, self.cfg)
        number = msg.meta["evaluation"]
        if not self.serving() or number < self.evaluation:
            return  # not in this evaluation, or an older one's: dropped
        if number > self.evaluation:
            self.early.add(msg)
            return
        self._check_route(msg, path, pos, pipeline)
        h = self.to_device({"activations": tensor})["activations"]
        if pos == len(path):
            self._loss(msg.microbatch, pipeline, h)
        else:
            self._forward(msg, path, pos, pipeline, h)

    def _check_route(self, msg: Message, path: list[int], pos: int, pipeline: int) -> None:
        """The route is this evaluation's for ``pipeline`` (stages in order), this node is at ``pos`` and the sender
        is the node before it.

        Raises:
            Rejected: (counter ``off_route``) any of these does not hold.
        """
        me, n = self.ctx.node_id, len(path)
        what = f"VALIDATION of batch {msg.microbatch} (pipeline {pipeline}) from node {msg.sender}"
        want = route(pipeline, self.members, self.cfg.n_stages, in_order(self.cfg.n_stages))
        if want is None or path != want:
            raise Rejected(f"{what}: route {path[:8]} is not this evaluation's route {want}", "off_route")
        if path[pos % n] != me or msg.sender != path[pos - 1]:
            raise Rejected(
                f"{what}: position {pos} of route {path[:8]} is not node {me} after it", "off_route"
            )

    def _forward(self, msg: Message, path: list[int], pos: int, pipeline: int, h: torch.Tensor) -> None:
        """A transformer stage: its blocks on (B, T, d), no graph kept; on to the next node of the route."""
        module = self.state.module
        with torch.no_grad(), autocast_for(h.device):
            y = module(h)
        meta = {"evaluation": self.evaluation, "route": path, "pos": pos + 1, "pipeline": pipeline}
        nxt = path[(pos + 1) % len(path)]
        self.ctx.send(
            nxt, MessageType.VALIDATION, self.iteration, msg.microbatch, meta, {"activations": y.float()}
        )

    # ------------------------------------------------------------------ stage 0

    def _pump(self) -> None:
        """Embed and send batches of this node's share while fewer than ``in_flight`` are out."""
        assert self.batches is not None
        module, device = self.state.module, next(self.state.module.parameters()).device
        while self.queue and len(self.out) < self.cfg.in_flight:
            i = self.queue.pop(0)
            path = route(self.pipeline, self.members, self.cfg.n_stages, in_order(self.cfg.n_stages))
            if path is None:  # a stage without a serving node: the supervisor gives the evaluation up
                log.warning(
                    "node %d: evaluation %d has no route for its batches", self.ctx.node_id, self.evaluation
                )
                self.queue.clear()
                return
            batch = self.batches[i]  # (B, T+1) int64
            with torch.no_grad(), autocast_for(device):
                h = module.embed(batch[:, :-1].to(device))  # (B, T, d)
            self.out[i] = batch[:, 1:]
            meta = {"evaluation": self.evaluation, "route": path, "pos": 1, "pipeline": self.pipeline}
            self.ctx.send(
                path[1], MessageType.VALIDATION, self.iteration, i, meta, {"activations": h.float()}
            )
        if not self.out and not self.queue:
            self._report()

    def _loss(self, batch: int, pipeline: int, h: torch.Tensor) -> None:
        """Stage 0: the head and the token-mean cross-entropy (nats) of a batch back from the last stage, as the
        simulator's checkfree.pipeline.forward_loss computes it.

        Raises:
            ProtocolError: the batch is not out on this node's pipeline, or ``h`` does not fit its labels.
        """
        labels = self.out.get(batch)
        if self.ctx.stage != 0 or pipeline != self.pipeline or labels is None:
            raise ProtocolError(f"validation batch {batch} of pipeline {pipeline} is not out here")
        if h.shape[:2] != labels.shape:
            raise ProtocolError(f"final activations are {tuple(h.shape)}; expected {tuple(labels.shape)} x d")
        del self.out[batch]
        with torch.no_grad(), autocast_for(h.device):
            # the plain path always, as the simulator's evaluation: the validation loss is computed as before
            loss = head_loss(self.state.module, h, labels.to(h.device), fused=False)
        value = float(loss)  # one host sync per batch: the supervisor needs the number
        self.diverged |= not math.isfinite(value)
        self.loss_sum += value if math.isfinite(value) else 0.0
        self.count += 1
        self._pump()

    def _report(self) -> None:
        meta = control(
            "evaluated",
            evaluation=self.evaluation,
            loss_sum=self.loss_sum,
            batches=self.count,
            **({"diverged": True} if self.diverged else {}),
        )
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, self.iteration, meta=meta)
