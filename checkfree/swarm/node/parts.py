"""A swarm node's parts, built from the supervisor's WELCOME, and its answers about its own weights.

:func:`build_parts` makes the stage replica (:class:`~checkfree.swarm.node.context.StageState`: the stage module
of checkfree.model with the init seed every replica shares, Adam at the config's lr) and hands each part the
node's :class:`~checkfree.swarm.node.context.NodeContext`: the gradient exchange (checkfree.swarm.node.gradient_sync), the
CheckFree+ stage-0 copies (checkfree.swarm.node.stage0_copies), stage 0's pipeline driver or a transformer stage's
relay, and the context of a weights fetch (checkfree.swarm.node.recovering). :func:`answer_weights_request` and
:func:`send_checkpoint` serve this replica's weights to a peer and to the storage node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.compute import StageWorker, build_stage
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.node.driver import PipelineDriver, stage0_batches
from checkfree.swarm.node.gradient_sync import GradientSync
from checkfree.swarm.node.recovering import FetchContext
from checkfree.swarm.node.relay import StageRelay
from checkfree.swarm.node.stage0_copies import Stage0Copies, stage0_part_shapes
from checkfree.swarm.policies import SwarmRecovery
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType


@dataclass
class NodeParts:
    """What a node builds once it knows the swarm's config.

    Attributes:
        state: the stage replica it trains.
        worker: forward/backward of the stage with saved activations.
        stage0_copies: pushing (stage 0) or holding (stages 1, S) the CheckFree+ copies.
        gradients: the replicas' gradient averaging.
        fetch: what a recovery or rollback of this node needs.
        pipeline: stage 0's driver, or a transformer stage's relay.
    """

    state: StageState
    worker: StageWorker
    stage0_copies: Stage0Copies
    gradients: GradientSync
    fetch: FetchContext
    pipeline: PipelineDriver | StageRelay


def build_parts(
    ctx: NodeContext,
    cfg: SwarmConfig,
    strategy: SwarmRecovery,
    welcome: dict[str, Any],
    cache_dir: Path | None,
    reject: Callable[[Message, str], None],
    device: torch.device | None = None,
) -> NodeParts:
    """The parts of node ``ctx.node_id`` holding ``ctx.stage`` on ``device`` (None: the CPU), from the WELCOME's
    ``vocab_size`` (and ``rank``, the pipeline a stage-0 node drives)."""
    vocab_size, stage = int(welcome["vocab_size"]), ctx.stage
    module = build_stage(cfg.model, stage, vocab_size, cfg.init_seed, device)
    state = StageState(module, W.make_optimizer(module, cfg.model.lr))
    worker = StageWorker(module, stage)
    keeps = strategy.keeps_stage0_copy
    holder = keeps and stage in (1, cfg.n_stages)
    shapes = stage0_part_shapes(cfg.model, vocab_size, cfg.init_seed) if holder else None
    copies = Stage0Copies(ctx, cfg.n_stages, keeps, state, shapes)
    gradients = GradientSync(ctx, state, cfg, lambda: worker.microbatches)
    fetch = FetchContext(ctx, cfg, reject)
    pipeline: PipelineDriver | StageRelay
    if stage == 0:
        batches = stage0_batches(cfg, welcome, cache_dir)
        pipeline = PipelineDriver(ctx, cfg, strategy.swaps, batches, worker)
    else:
        pipeline = StageRelay(ctx, worker)
    return NodeParts(state, worker, copies, gradients, fetch, pipeline)


def answer_weights_request(ctx: NodeContext, msg: Message, state: StageState, copies: Stage0Copies) -> None:
    """Answer a listed peer's WEIGHTS_REQUEST: this stage's weights (+ Adam state when ``optimizer`` is asked),
    the stage-0 copy it names (``part``), or an error when it asks for another stage."""
    meta, send = msg.meta, ctx.send
    reply = {"request": meta["request"], **state.weights_meta()}
    if "part" in meta:  # a stage-0 replacement asks for the copy this node holds (CheckFree+)
        copies.answer(msg, reply)
        return
    if meta["stage"] != ctx.stage:
        send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "error": "wrong stage"})
        return
    tensors = W.stage_tensors(state.module, state.opt if meta.get("optimizer") else None)
    send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=reply, tensors=tensors)


def send_checkpoint(ctx: NodeContext, state: StageState, storage_id: int) -> None:
    """Ship weights + Adam state of the current iteration to the storage node (asynchronous: the send never
    blocks)."""
    tensors = W.stage_tensors(state.module, state.opt)
    ctx.send(
        storage_id, MessageType.CHECKPOINT, ctx.clock.iteration, meta=state.weights_meta(), tensors=tensors
    )
