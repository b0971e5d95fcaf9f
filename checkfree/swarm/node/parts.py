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
stage or stage-0 part it may ask for, whether with Adam state, and the plan's number ``seq``). We chose this over a
plan the requester forwards because it needs no signatures: the grant comes from the supervisor over its own
authenticated link. Every request names the plan it is made under (``seq``). A node answers

* a request under the plan of its newest grant for that requester that the grant covers, once per grant (a newer
  plan for that requester replaces its grants), and only while the bytes it sent that requester within the last
  ``request_timeout`` seconds are below :data:`OUTSTANDING_ANSWERS` full answers (weights and Adam moments: the
  cap on outstanding bytes);
* a request of the supervisor (the model's gather, tests).

**No silent refusals.** A request under a plan newer than any grant it holds waits (its grant is on its way: the
supervisor sends it before the plan, but over another link), bounded per sender (checkfree.swarm.node.early) and
in time: after :data:`GRANT_WAIT_S` it is refused. Every other request it will not serve is refused at once with
why, in a WEIGHTS_RESPONSE that carries the request's id, its stage and ``refused`` (one of :data:`REFUSALS`) and
nothing else (no tensor, version or number of the stage; checkfree.swarm.wire.control): ``plan_superseded`` (a newer plan of the requester
replaced the one it names: a late request), ``grant_used`` (answered under that plan already), ``no_grant`` (no
grant covers it: another stage or part, Adam state not granted, no plan named, or no grant came in time),
``byte_cap`` (the cap on outstanding bytes). So the requester moves on at once, to its next source or to the
supervisor for a new plan (checkfree.swarm.node.recovering), instead of waiting out ``request_timeout``. A
refusal goes only to a peer the supervisor lists (a node dials no one else), at most :data:`REFUSALS_PER_WINDOW`
per requester within ``request_timeout`` (more are dropped, counted and held against the sender), and is counted
per reason (the node's ``refused_requests``, throughput.json's ``refused_weight_requests``). A request that names
something its plan does not (another stage or part, Adam state, a second answer, past the byte cap) still counts
against its sender as before (checkfree.swarm.supervisor.conduct); a late or early one does not.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from checkfree.loss import resolve_loss_path
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
from checkfree.swarm.wire.control import REFUSALS
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType

log = logging.getLogger(__name__)

OUTSTANDING_ANSWERS = 2
"""Full answers (weights + Adam moments of this stage) a requester may have been sent within ``request_timeout``
seconds (the cap on outstanding bytes per requester)."""
GRANT_WAIT_S = 5.0
"""Seconds a request under a plan newer than the grants it holds waits for its grant (at most a quarter of
``request_timeout``) before it is refused ``no_grant``."""
REFUSALS_PER_WINDOW = 8
"""Refusals a requester is sent at most within ``request_timeout``; more requests are dropped and counted."""
WAITING_TRACKED = 1024
"""Waiting requests whose start of wait is remembered at most (the wait buffer holds far fewer)."""


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


@dataclass(frozen=True)
class Verdict:
    """What a node does with a WEIGHTS_REQUEST (:meth:`WeightGrants.judge`).

    Attributes:
        action: ``serve``, ``wait`` (for its grant) or ``refuse``. reason: the refusal's (:data:`REFUSALS`).
        why: one sentence for the log. offence: the request names what no grant gives its sender (counted against
            it, checkfree.swarm.supervisor.conduct); a late or early request is none.
    """

    action: str
    reason: str | None = None
    why: str = ""
    offence: bool = False


SERVE, WAIT = Verdict("serve"), Verdict("wait")


class WeightGrants:
    """Who may fetch this node's weights: the grants from the supervisor, the bytes sent to each requester and
    the refusals.

    Args:
        state: the stage this node serves (the size of a full answer). window_s: seconds the bytes sent to a
            requester count as outstanding, and the window of the refusal budget (the config's
            ``request_timeout``).
        clock: seconds (monotonic); tests replace it.
    """

    def __init__(
        self, state: StageState, window_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.state, self.window_s, self.clock = state, window_s, clock
        self.wait_s = min(GRANT_WAIT_S, window_s / 4)
        """Seconds a request waits for its grant before it is refused."""
        self.grants: dict[int, dict[tuple[int, str | None], Grant]] = {}
        """Requester → (stage, part) → its grant (all of its newest plan)."""
        self.sent: dict[int, deque[tuple[float, int]]] = {}
        """Requester → (time, bytes) of the answers sent to it within the window."""
        self.refused: dict[str, int] = {}
        """Refusals sent, per reason, and ``withheld``: refusals over a requester's budget (dropped)."""
        self._refusals: dict[int, deque[float]] = {}
        self._waiting_since: dict[str, float] = {}

    def grant(self, meta: dict[str, Any]) -> None:
        """CONTROL ``grant`` from the supervisor; a newer plan of the requester replaces its older grants."""
        held = self.grants.setdefault(meta["requester"], {})
        if any(g.seq > meta["seq"] for g in held.values()):
            return  # a grant of an older plan, overtaken on its way
        for key in [k for k, g in held.items() if g.seq < meta["seq"]]:
            del held[key]
        held[(meta["stage"], meta.get("part"))] = Grant(meta["seq"], meta["optimizer"])

    def judge(self, msg: Message) -> Verdict:
        """What to do with ``msg``, a WEIGHTS_REQUEST from a listed peer while this node serves (or from the
        supervisor, always served): serve it, let it wait for its grant (its plan is newer than every grant its
        sender holds), or refuse it with a reason (module docstring)."""
        if msg.sender == SUPERVISOR_ID:
            return SERVE
        meta, held = msg.meta, self.grants.get(msg.sender, {})
        seq, newest = meta.get("seq"), max((g.seq for g in held.values()), default=None)
        if newest is None or (seq is not None and seq > newest):
            return WAIT  # its grant is on its way
        what = f"stage {meta['stage']}" + (f" part {meta['part']!r}" if "part" in meta else "")
        if seq is None:
            return Verdict("refuse", "no_grant", f"a request for {what} that names no plan", offence=True)
        if seq < newest:
            why = f"a request for {what} under plan {seq}, which plan {newest} replaced"
            return Verdict("refuse", "plan_superseded", why)
        grant = held.get((meta["stage"], meta.get("part")))
        if grant is None:
            why = f"a request for {what}, which plan {seq} of node {msg.sender} does not name"
            return Verdict("refuse", "no_grant", why, offence=True)
        if meta.get("optimizer") and not grant.optimizer:
            why = f"a request for the Adam state of {what}, which plan {seq} does not take"
            return Verdict("refuse", "no_grant", why, offence=True)
        if grant.answered:
            why = f"a second request for {what} under plan {seq}, answered once already"
            return Verdict("refuse", "grant_used", why, offence=True)
        if self._outstanding(msg.sender) >= OUTSTANDING_ANSWERS * self._full_bytes():
            why = f"node {msg.sender} was sent {OUTSTANDING_ANSWERS} full answers already"
            return Verdict("refuse", "byte_cap", why, offence=True)
        return SERVE

    def overdue(self, msg: Message) -> bool:
        """Whether ``msg``, a waiting request, has waited :attr:`wait_s` seconds since it was first asked about
        (its wait ends with :meth:`forget`)."""
        now = self.clock()
        if (
            len(self._waiting_since) > WAITING_TRACKED
        ):  # requests that left the wait unseen: forget the oldest
            for rid in list(self._waiting_since)[: WAITING_TRACKED // 2]:
                del self._waiting_since[rid]
        return now - self._waiting_since.setdefault(str(msg.meta["request"]), now) >= self.wait_s

    def forget(self, msg: Message) -> None:
        """``msg`` waits no more (answered, refused or dropped)."""
        self._waiting_since.pop(str(msg.meta["request"]), None)

    def may_refuse(self, requester: int) -> bool:
        """Whether ``requester`` may be sent one more refusal now (:data:`REFUSALS_PER_WINDOW` per window); if
        so it is counted against the budget."""
        times, now = self._refusals.setdefault(requester, deque()), self.clock()
        while times and times[0] < now - self.window_s:
            times.popleft()
        if len(times) >= REFUSALS_PER_WINDOW:
            self.refused["withheld"] = self.refused.get("withheld", 0) + 1
            return False
        times.append(now)
        return True

    def answered(self, msg: Message, nbytes: int) -> None:
        """``msg`` was answered with ``nbytes`` of tensors: its grant is used up."""
        self.forget(msg)
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
        takeover: stage 0: pipeline → a driver of that pipeline's batches, for a pipeline whose stage-0 node died
            mid-attempt (issue 39 point 1; made once per pipeline); None on the other stages.
    """

    state: StageState
    worker: StageWorker
    stage0_copies: Stage0Copies
    gradients: GradientSync
    fetch: FetchContext
    pipeline: PipelineDriver | StageRelay
    grants: WeightGrants
    takeover: Callable[[int], PipelineDriver] | None = None


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
    fused = False
    if stage == 0:  # the head and the loss: the swarm config's fused_loss on this node's device
        path = resolve_loss_path(cfg.fused_loss, (device or torch.device("cpu")).type, option="fused_loss")
        log.info("node %d: %s", ctx.node_id, path.line)
        fused = path.fused
    worker = StageWorker(module, stage, fused)
    keeps = policy.keeps_stage0_copy
    holder = keeps and stage in (1, cfg.n_stages)
    shapes = stage0_part_shapes(cfg.model, vocab_size, cfg.init_seed) if holder else None
    copies = Stage0Copies(ctx, cfg.n_stages, keeps, state, shapes)
    gradients = GradientSync(ctx, state, cfg, lambda: worker.microbatches, lambda: worker.settled)
    fetch = FetchContext(ctx, cfg, reject)
    pipeline: PipelineDriver | StageRelay
    takeover = None
    if stage == 0:
        batches = stage0_batches(cfg, welcome, cache_dir)
        pipeline = PipelineDriver(ctx, cfg, policy.swaps, batches, worker)
        drivers: dict[int, PipelineDriver] = {}

        def takeover(p: int) -> PipelineDriver:
            if p not in drivers:
                source = stage0_batches(cfg, {**welcome, "rank": p}, cache_dir)
                drivers[p] = PipelineDriver(ctx, cfg, policy.swaps, source, worker)
            return drivers[p]

    else:
        pipeline = StageRelay(ctx, worker)
    grants = WeightGrants(state, cfg.request_timeout)
    return NodeParts(state, worker, copies, gradients, fetch, pipeline, grants, takeover)


def answer_weights_request(
    ctx: NodeContext, msg: Message, state: StageState, copies: Stage0Copies, grants: WeightGrants
) -> None:
    """Answer a WEIGHTS_REQUEST that ``grants`` lets this node serve (:meth:`WeightGrants.judge`, asked by the
    caller): this stage's weights (+ Adam state when ``optimizer`` is asked), the stage-0 copy it names (``part``),
    or an error when it asks for another stage (only the supervisor can: a grant names this node's own stage)."""
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


def refuse_weights_request(
    ctx: NodeContext,
    msg: Message,
    grants: WeightGrants,
    verdict: Verdict,
    reject: Callable[[Message, str], None],
) -> None:
    """Tell the requester of ``msg`` at once why this node will not serve it (module docstring): the request's
    id and stage and ``refused``, nothing else; within the requester's refusal budget, else dropped. A request
    that is an ``offence`` is also counted against its sender (``reject``)."""
    assert verdict.reason in REFUSALS, verdict
    grants.forget(msg)
    if not grants.may_refuse(msg.sender):
        reject(msg, f"{verdict.why}; not refused again: {REFUSALS_PER_WINDOW} refusals within the window")
        return
    meta = {"stage": msg.meta["stage"], "request": msg.meta["request"], "refused": verdict.reason}
    ctx.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=meta)
    grants.refused[verdict.reason] = grants.refused.get(verdict.reason, 0) + 1
    if verdict.offence:
        reject(msg, f"{verdict.why} (refused: {verdict.reason})")
    else:
        log.info("node %d: refused node %d: %s (%s)", ctx.node_id, msg.sender, verdict.why, verdict.reason)


def send_checkpoint(ctx: NodeContext, state: StageState, storage_id: int) -> None:
    """Ship weights + Adam state of the current iteration to the storage node (asynchronous: the send never
    blocks)."""
    tensors = W.stage_tensors(state.module, state.opt)
    ctx.send(
        storage_id, MessageType.CHECKPOINT, ctx.clock.iteration, meta=state.weights_meta(), tensors=tensors
    )
