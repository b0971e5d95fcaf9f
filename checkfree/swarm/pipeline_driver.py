"""Stage 0's side of the pipeline: batches in, embed, FORWARD out; final activations in, head + loss, BACKWARD out.

See checkfree.swarm.worker for the route and message flow. One driver per stage-0 node, one pipeline each.
A microbatch that has not come back within ``microbatch_timeout`` seconds is reported to the supervisor
(CONTROL ``stalled``), which aborts the attempt and redoes the iteration.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from checkfree.pipeline import stage_order
from checkfree.swarm.config import route
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.worker import make_batches

if TYPE_CHECKING:
    from checkfree.swarm.node import Node

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """$CHECKFREE_CACHE, else ~/.cache/checkfree (as the simulator)."""
    return Path(os.environ.get("CHECKFREE_CACHE", Path.home() / ".cache" / "checkfree")).resolve()


class PipelineDriver:
    """Runs the microbatches of one pipeline per iteration with at most ``in_flight`` outstanding."""

    def __init__(self, node: Node, welcome: dict[str, Any]) -> None:
        self.node = node
        cfg = node.cfg
        self.rank = int(welcome["rank"])
        self.batches = make_batches(
            cfg.model,
            cfg.data,
            self.rank,
            cfg.replicas,
            int(welcome["vocab_size"]),
            node.cache_dir or default_cache_dir(),
        )
        self.active = False
        self.pipeline = -1
        self._clear()

    def _clear(self) -> None:
        self.inflight: dict[int, float] = {}
        self.labels: dict[int, torch.Tensor] = {}
        self.routes: dict[int, list[int]] = {}
        self.losses: dict[int, float] = {}
        self.next_mb = 0
        self.stall_reported = False
        self.t_begin = time.monotonic()

    def begin(self) -> None:
        """A new epoch: start the first ``in_flight`` microbatches."""
        self._clear()
        stage0 = self.node.members.get(0, [])
        self.active = self.node.id in stage0
        if self.active:
            self.pipeline = stage0.index(self.node.id)
            self._pump()

    def abort(self) -> None:
        self._clear()
        self.active = False

    def _pump(self) -> None:
        node, cfg = self.node, self.node.cfg
        while self.active and self.next_mb < cfg.mb_count and len(self.inflight) < cfg.in_flight:
            mb = self.next_mb
            self.next_mb += 1
            order = stage_order(mb, cfg.n_stages, node.strategy.swaps)
            path = route(self.pipeline, node.members, cfg.n_stages, order)
            if path is None:
                self._stalled(f"no route for microbatch {mb}: a stage has no serving node")
                return
            batch = self.batches.batch(node.iteration * cfg.mb_count + mb)  # (B, T+1) int64
            self.labels[mb], self.routes[mb] = batch[:, 1:], path
            self.inflight[mb] = time.monotonic()
            h = node.worker.embed((self.pipeline, mb), batch[:, :-1])
            node.send(
                path[1],
                MessageType.FORWARD,
                node.iteration,
                mb,
                {"epoch": node.epoch, "route": path, "pos": 1, "pipeline": self.pipeline},
                {"activations": h},
            )

    def on_message(
        self, msg: Message, path: list[int], pos: int, key: tuple[int, int], tensor: torch.Tensor
    ) -> None:
        """A microbatch returning: final activations (head + loss) or the first stage's input gradient."""
        node, mb = self.node, msg.microbatch
        if not self.active or key[0] != self.pipeline or mb not in self.inflight or path != self.routes[mb]:
            raise ProtocolError(f"microbatch {mb} of pipeline {key[0]} is not in flight here")
        meta = {"epoch": node.epoch, "route": path, "pipeline": self.pipeline}
        if msg.type == MessageType.FORWARD and pos == len(path):
            if mb in self.losses:
                raise ProtocolError(f"microbatch {mb} came back twice")
            loss, grad = node.worker.head_loss(tensor, self.labels[mb], node.cfg.mb_count)
            self.losses[mb] = loss
            node.send(
                path[-1],
                MessageType.BACKWARD,
                node.iteration,
                mb,
                {**meta, "pos": len(path) - 1},
                {"gradients": grad},
            )
        elif msg.type == MessageType.BACKWARD and pos == 0:
            if not node.worker.embed_backward(key, tensor):
                raise ProtocolError(f"no saved embedding for microbatch {mb}")
            del self.inflight[mb]
            self._pump()
            if not self.inflight and self.next_mb >= node.cfg.mb_count:
                self._finish()
        else:
            raise ProtocolError(f"{msg.type.name} at route position {pos} is not for stage 0")

    def _finish(self) -> None:
        node = self.node
        losses = [self.losses[mb] for mb in sorted(self.losses)]
        b, t = node.cfg.model.batch_size, node.cfg.model.seq_l
        node.send(
            SUPERVISOR_ID,
            MessageType.ITERATION_END,
            node.iteration,
            -1,
            {
                "epoch": node.epoch,
                "loss": sum(losses) / len(losses),
                "tokens": len(losses) * b * t,
                "seconds": time.monotonic() - self.t_begin,
            },
        )
        self.active = False

    def _stalled(self, reason: str) -> None:
        if not self.stall_reported:
            self.stall_reported = True
            log.warning("node %d: epoch %d stalled: %s", self.node.id, self.node.epoch, reason)
            self.node.send(
                SUPERVISOR_ID,
                MessageType.CONTROL,
                self.node.iteration,
                meta={"command": "stalled", "epoch": self.node.epoch, "reason": reason},
            )

    def tick(self) -> None:
        """Report a microbatch that has been out longer than ``microbatch_timeout``."""
        if not self.active or not self.inflight:
            return
        mb, sent = min(self.inflight.items(), key=lambda kv: kv[1])
        if time.monotonic() - sent > self.node.cfg.microbatch_timeout:
            self._stalled(f"microbatch {mb} not back after {self.node.cfg.microbatch_timeout:.0f} s")
