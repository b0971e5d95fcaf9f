"""A swarm node's parts, built from the supervisor's WELCOME, and its answers about its own weights.

:func:`build_parts` makes the stage replica (:class:`~checkfree.swarm.node.context.StageState`: the stage module
of checkfree.model with the init seed every replica shares, Adam at the config's lr) and hands each part the
node's :class:`~checkfree.swarm.node.context.NodeContext`: the gradient exchange (checkfree.swarm.node.gradient_sync), the
CheckFree+ stage-0 copies (checkfree.swarm.node.stage0_copies), stage 0's pipeline driver or a transformer stage's
relay, and the context of a weights fetch (checkfree.swarm.node.recovering). :func:`answer_weights_request` and
:func:`send_checkpoint` serve this replica's weights to a peer and to the storage node.

**Weights only to whom the plan names** (:class:`WeightGrants`). A node's weights and Adam state go only to a
replacement that the supervisor's plan names: when the supervisor sends a replacement its plan (in WELCOME, or
CONTROL ``plan``), it first tells every serving node of each source stage (CONTROL ``grant``: the requester, the
stage or stage-0 part it may ask for, whether with Adam state, and the plan's number). We chose this over a plan
the requester forwards because it needs no signatures: the grant comes from the supervisor over its own
authenticated link. A node then answers

* a request covered by a grant, once per grant (a newer plan for that requester replaces its grants), and only
  while the bytes it sent that requester within the last ``request_timeout`` seconds are below
  :data:`OUTSTANDING_ANSWERS` full answers (weights and Adam moments: the cap on outstanding bytes);
* a request of the supervisor (tests read weights that way).

A request from a requester without a grant waits, bounded per sender (checkfree.swarm.node.early): its grant
may still be on its way (the supervisor sends it before the plan, but over another link). A request a grant does
not cover (another stage or part, Adam state not granted, answered already, over the byte cap) is refused:
dropped and counted against its sender, and nothing is sent back.
"""

from __future__ import annotations

import time
from collections import deque
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
from checkfree.swarm.policies import SwarmPolicy
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

OUTSTANDING_ANSWERS = 2
"""Full answers (weights + Adam moments of this stage) a requester may have been sent within ``request_timeout``
seconds (the cap on outstanding bytes per requester)."""


@dataclass
class Grant:
    """The supervisor's leave for one replacement to fetch this node's stage (or a stage-0 part) once.

    Attributes:
        seq: the number of the requester's plan (0: its WELCOME's). optimizer: Adam state may be asked for.
        answered: the one answer was sent.
    """

    seq: int
    optimizer: bool
    answered: bool = False


class WeightGrants:
    """Who may fetch this node's weights: the grants from the supervisor, and the bytes sent to each requester.

    Args:
        state: the stage this node serves (the size of a full answer). window_s: seconds the bytes sent to a
            requester count as outstanding (the config's ``request_timeout``).
        clock: seconds (monotonic); tests replace it.
    """

    def __init__(
        self, state: StageState, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.state, self.window_s, self.clock = state, window_s, clock
        self.grants: dict[int, dict[tuple[int, str | None], Grant]] = {}
        """Requester → (stage, part) → its grant."""
        self.sent: dict[int, deque[tuple[float, int]]] = {}
        """Requester → (time, bytes) of the answers sent to it within the window."""

    def grant(self, meta: dict[str, Any]) -> None:
        """CONTROL ``grant`` from the supervisor; a newer plan of the requester replaces its older grants."""
        held = self.grants.setdefault(meta["requester"], {})
        if any(g.seq > meta["seq"] for g in held.values()):
            return  # a grant of an older plan, overtaken on its way
        for key in [k for k, g in held.items() if g.seq < meta["seq"]]:
            del held[key]
        held[(meta["stage"], meta.get("part"))] = Grant(meta["seq"], meta["optimizer"])

    def covers(self, msg: Message) -> bool:
        """Whether ``msg`` (a WEIGHTS_REQUEST from a listed peer) is answered now: True for the supervisor and
        under a grant; False when its sender holds no grant yet (the request waits for one).

        Raises:
            ProtocolError: the sender holds grants, but none covers this request (another stage or part, or
                Adam state not granted), its grant was answered already, or the answer would exceed the cap on
                outstanding bytes (the request is dropped and counted; nothing is answered).
        """
        if msg.sender == SUPERVISOR_ID:
            return True
        held = self.grants.get(msg.sender)
        if not held:
            return False
        meta = msg.meta
        grant = held.get((meta["stage"], meta.get("part")))
        what = f"stage {meta['stage']}" + (f" part {meta['part']!r}" if "part" in meta else "")
        if grant is None:
            raise ProtocolError(f"a request for {what}, which no plan of node {msg.sender} names")
        if meta.get("optimizer") and not grant.optimizer:
            raise ProtocolError(f"a request for the Adam state of {what}, which its plan does not take")
        if grant.answered:
            raise ProtocolError(f"a second request for {what} under plan {grant.seq}, answered once already")
        if self._outstanding(msg.sender) >= OUTSTANDING_ANSWERS * self._full_bytes():
            raise ProtocolError(f"node {msg.sender} was sent {OUTSTANDING_ANSWERS} full answers already")
        return True

    def answered(self, msg: Message, nbytes: int) -> None:
        """``msg`` was answered with ``nbytes`` of tensors: its grant is used up."""
        if msg.sender == SUPERVISOR_ID:
            return
        grant = self.grants.get(msg.sender, {}).get((msg.meta["stage"], msg.meta.get("part")))
        if grant is not None:
            grant.answered = True
        self.sent.setdefault(msg.sender, deque()).append((self.clock(), nbytes))

    def _outstanding(self, requester: int) -> int:
        sent, cutoff = self.sent.get(requester, deque()), self.clock() - self.window_s
        while sent and sent[0][0] < cutoff:
            sent.popleft()
        return sum(n for _, n in sent)

    def _full_bytes(self) -> int:
        """Bytes of this stage's weights and both Adam moments."""
        return 3 * sum(t.numel() * t.element_size() for t in self.state.module.state_dict().values())


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
        grants: who may fetch this node's weights (the supervisor's grants).
    """

    state: StageState
    worker: StageWorker
    stage0_copies: Stage0Copies
    gradients: GradientSync
    fetch: FetchContext
    pipeline: PipelineDriver | StageRelay
    grants: WeightGrants


def build_parts(
    ctx: NodeContext,
    cfg: SwarmConfig,
    policy: SwarmPolicy,
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
    keeps = policy.keeps_stage0_copy
    holder = keeps and stage in (1, cfg.n_stages)
    shapes = stage0_part_shapes(cfg.model, vocab_size, cfg.init_seed) if holder else None
    copies = Stage0Copies(ctx, cfg.n_stages, keeps, state, shapes)
    gradients = GradientSync(ctx, state, cfg, lambda: worker.microbatches)
    fetch = FetchContext(ctx, cfg, reject)
    pipeline: PipelineDriver | StageRelay
    if stage == 0:
        batches = stage0_batches(cfg, welcome, cache_dir)
        pipeline = PipelineDriver(ctx, cfg, policy.swaps, batches, worker)
    else:
        pipeline = StageRelay(ctx, worker)
    grants = WeightGrants(state, cfg.request_timeout)
    return NodeParts(state, worker, copies, gradients, fetch, pipeline, grants)


def answer_weights_request(
    ctx: NodeContext, msg: Message, state: StageState, copies: Stage0Copies, grants: WeightGrants
) -> None:
    """Answer a WEIGHTS_REQUEST that ``grants`` covers (:meth:`WeightGrants.covers`, asked by the caller):
    this stage's weights (+ Adam state when ``optimizer`` is asked), the stage-0 copy it names (``part``), or an
    error when it asks for another stage (only the supervisor can: a grant names this node's own stage)."""
    meta, send = msg.meta, ctx.send
    reply = {"request": meta["request"], **state.weights_meta()}
    if "part" in meta:  # a stage-0 replacement asks for the copy this node holds (CheckFree+)
        grants.answered(msg, copies.answer(msg, reply))
        return
    if meta["stage"] != ctx.stage:
        send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "error": "wrong stage"})
        return
    tensors = W.stage_tensors(state.module, state.opt if meta.get("optimizer") else None)
    send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=reply, tensors=tensors)
    grants.answered(msg, sum(t.numel() * t.element_size() for t in tensors.values()))


def send_checkpoint(ctx: NodeContext, state: StageState, storage_id: int) -> None:
    """Ship weights + Adam state of the current iteration to the storage node (asynchronous: the send never
    blocks)."""
    tensors = W.stage_tensors(state.module, state.opt)
    ctx.send(
        storage_id, MessageType.CHECKPOINT, ctx.clock.iteration, meta=state.weights_meta(), tensors=tensors
    )
