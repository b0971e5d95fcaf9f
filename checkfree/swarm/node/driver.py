"""Stage 0's side of the pipeline: batches in, embed, FORWARD out; final activations in, head + loss, BACKWARD out.

See checkfree.swarm.node.compute for the route and message flow. One driver per stage-0 node, one pipeline each,
plus one per pipeline it takes over when that pipeline's stage-0 node dies mid-attempt
(:meth:`PipelineDriver.take_over`).
A ``reroute`` that moves this pipeline (a replica on its route died mid-attempt) sends its microbatches again on
the new route (:meth:`PipelineDriver.rerouted`; issue 39 point 1).
A microbatch that has not come back within ``microbatch_timeout`` seconds is reported to the supervisor
(CONTROL ``stalled``), which aborts the attempt and redoes the iteration. That is also what happens to a
microbatch whose messages the data plane refused (checkfree.swarm.node.relay) when no genuine copy follows,
and to one whose final activations give a NaN or infinite loss (nothing is back-propagated from them; the
``stalled`` reason says so): a run whose loss diverges to NaN stops with the supervisor's ``SwarmError``
after ``max_attempts`` instead of training on NaN.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from checkfree.data.spec import default_cache_dir
from checkfree.pipeline import stage_order
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.compute import StageWorker, make_batches
from checkfree.swarm.node.context import NodeContext
from checkfree.swarm.reroute import stable_route
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError, Rejected

log = logging.getLogger(__name__)


def stage0_batches(cfg: SwarmConfig, welcome: dict[str, Any], cache_dir: Path | None) -> Any:
    """The batches of the pipeline the WELCOME's ``rank`` names (checkfree.swarm.node.compute.make_batches)."""
    return make_batches(
        cfg.model,
        cfg.data,
        int(welcome["rank"]),
        cfg.replicas,
        int(welcome["vocab_size"]),
        cache_dir or default_cache_dir(),
    )


class PipelineDriver:
    """Runs the microbatches of one pipeline per iteration with at most ``in_flight`` outstanding.

    Args:
        ctx: this stage-0 node, its attempt and iteration, the serving replicas of every stage (a route takes
            one of each), and the ``send`` of FORWARD / BACKWARD, ITERATION_END and ``stalled``.
        cfg: the swarm config (microbatches, in-flight limit, timeouts, model batch shape).
        swaps: CheckFree+ stage order on odd microbatches.
        batches: its pipeline's batches (:func:`stage0_batches`): ``batch(i)`` → (B, T+1) int64 token ids.
        worker: embeds, runs the head and loss, and back-propagates into stage 0.
    """

    def __init__(
        self, ctx: NodeContext, cfg: SwarmConfig, swaps: bool, batches: Any, worker: StageWorker
    ) -> None:
        self.ctx, self.cfg, self.swaps, self.batches, self.worker = ctx, cfg, swaps, batches, worker
        self.active = False
        self.pipeline = -1
        self.running = False
        """This node drives a pipeline in the current attempt (its ITERATION_END may be sent already)."""
        self.resent = 0
        """Microbatches of this attempt sent again after a re-route (the ITERATION_END's ``resent``)."""
        self._clear()

    def _clear(self) -> None:
        self.inflight: dict[int, float] = {}
        self.labels: dict[int, torch.Tensor] = {}
        self.routes: dict[int, list[int]] = {}
        self.losses: dict[int, float] = {}
        self.refused: dict[int, str] = {}
        """microbatch → why its last final activations were refused (said in a ``stalled`` report)."""
        self.next_mb = 0
        self.stall_reported = False
        self.t_begin = time.monotonic()

    def begin(self) -> None:
        """A new attempt: start the first ``in_flight`` microbatches."""
        self._clear()
        self.resent = 0
        stage0 = self.ctx.membership.serving(0)
        self.active = self.running = self.ctx.node_id in stage0
        if self.active:
            self.pipeline = stage0.index(self.ctx.node_id)
            self._pump()

    def abort(self) -> None:
        self._clear()
        self.active = self.running = False

    def take_over(self, pipeline: int) -> None:
        """Drive ``pipeline`` from microbatch 0 in this attempt: its stage-0 node died and the routes give it to
        this node (checkfree.swarm.reroute.node_of; this driver holds that pipeline's batches, a function of
        the data position). Every microbatch counts as sent again (:attr:`resent`): what the dead node had
        started is not known here."""
        self._clear()
        self.pipeline, self.resent = pipeline, self.cfg.mb_count
        self.active = self.running = True
        log.info("node %d: takes over pipeline %d", self.ctx.node_id, pipeline)
        self._pump()

    def rerouted(self, moved: list[int]) -> None:
        """A ``reroute`` moved the pipelines ``moved`` (checkfree.swarm.reroute.moved): if this node's is one,
        every microbatch started so far is sent again from microbatch 0 on the new route (a node that died
        took its chain sum of the pipeline with it, so its substitute builds that chain anew in id order; the
        nodes that hold a microbatch's gradient already drop the copy's, checkfree.swarm.node.compute), and a
        new ITERATION_END follows, even if one was sent already. Counted in :attr:`resent`."""
        if not self.running or self.pipeline not in moved:
            return
        self.resent += self.next_mb
        t_begin = self.t_begin
        self._clear()
        self.t_begin = t_begin
        self.active = True
        log.info("node %d: pipeline %d re-routed; its microbatches go again", self.ctx.node_id, self.pipeline)
        self._pump()

    def _pump(self) -> None:
        ctx, cfg, iteration = self.ctx, self.cfg, self.ctx.clock.iteration
        while self.active and self.next_mb < cfg.mb_count and len(self.inflight) < cfg.in_flight:
            mb = self.next_mb
            self.next_mb += 1
            order = stage_order(mb, cfg.n_stages, self.swaps)
            members = ctx.membership
            path = stable_route(self.pipeline, members.at_begin(), members.members, cfg.n_stages, order)
            if path is None:
                self._stalled(f"no route for microbatch {mb}: a stage has no serving node")
                return
            batch = self.batches.batch(iteration * cfg.mb_count + mb)  # (B, T+1) int64
            self.labels[mb], self.routes[mb] = batch[:, 1:], path
            self.inflight[mb] = time.monotonic()
            h = self.worker.embed((self.pipeline, mb), batch[:, :-1])
            ctx.send(
                path[1],
                MessageType.FORWARD,
                iteration,
                mb,
                {
                    "attempt": ctx.clock.attempt,
                    "route": path,
                    "pos": 1,
                    "pipeline": self.pipeline,
                    "reroutes": ctx.clock.reroutes,
                },
                {"activations": h},
            )

    def on_message(
        self, msg: Message, path: list[int], pos: int, key: tuple[int, int], tensor: torch.Tensor
    ) -> None:
        """A microbatch returning: final activations (head + loss) or the first stage's input gradient."""
        ctx, mb, iteration = self.ctx, msg.microbatch, self.ctx.clock.iteration
        if not self.active or key[0] != self.pipeline or mb not in self.inflight or path != self.routes[mb]:
            raise ProtocolError(f"microbatch {mb} of pipeline {key[0]} is not in flight here")
        meta = {
            "attempt": ctx.clock.attempt,
            "route": path,
            "pipeline": self.pipeline,
            "reroutes": ctx.clock.reroutes,
        }
        if msg.type == MessageType.FORWARD and pos == len(path):
            if mb in self.losses:
                raise ProtocolError(f"microbatch {mb} came back twice")
            try:
                loss, grad = self.worker.head_loss(key, tensor, self.labels[mb], self.cfg.mb_count)
            except Rejected as exc:  # nothing recorded: the genuine activations may still come
                self.refused[mb] = str(exc)
                raise
            self.losses[mb] = loss
            ctx.send(
                path[-1],
                MessageType.BACKWARD,
                iteration,
                mb,
                {**meta, "pos": len(path) - 1},
                {"gradients": grad},
            )
        elif msg.type == MessageType.BACKWARD and pos == 0:
            if not self.worker.embed_backward(key, tensor):
                raise ProtocolError(f"no saved embedding for microbatch {mb}")
            del self.inflight[mb]
            self._pump()
            if not self.inflight and self.next_mb >= self.cfg.mb_count:
                self._finish()
        else:
            raise ProtocolError(f"{msg.type.name} at route position {pos} is not for stage 0")

    def _finish(self) -> None:
        losses = [self.losses[mb] for mb in sorted(self.losses)]
        b, t, clock = self.cfg.model.batch_size, self.cfg.model.seq_l, self.ctx.clock
        self.ctx.send(
            SUPERVISOR_ID,
            MessageType.ITERATION_END,
            clock.iteration,
            -1,
            {
                "attempt": clock.attempt,
                "loss": sum(losses) / len(losses),
                "tokens": len(losses) * b * t,
                "seconds": time.monotonic() - self.t_begin,
                "reroutes": clock.reroutes,
                "resent": self.resent,
                "pipeline": self.pipeline,
            },
        )
        self.active = False

    def _stalled(self, reason: str) -> None:
        if not self.stall_reported:
            self.stall_reported = True
            attempt = self.ctx.clock.attempt
            log.warning("node %d: attempt %d stalled: %s", self.ctx.node_id, attempt, reason)
            self.ctx.send(
                SUPERVISOR_ID,
                MessageType.CONTROL,
                self.ctx.clock.iteration,
                meta={"command": "stalled", "attempt": attempt, "reason": reason},
            )

    def tick(self) -> None:
        """Report a microbatch that has been out longer than ``microbatch_timeout``."""
        if not self.active or not self.inflight:
            return
        mb, sent = min(self.inflight.items(), key=lambda kv: kv[1])
        if time.monotonic() - sent > self.cfg.microbatch_timeout:
            why = f" (refused: {self.refused[mb]})" if mb in self.refused else ""
            self._stalled(f"microbatch {mb} not back after {self.cfg.microbatch_timeout:.0f} s{why}")
