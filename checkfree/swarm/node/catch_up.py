"""Exact catch-up of a replacement that recovers in the background (issue 39 point 3).

A replacement of a slot whose stage still has a serving replica copies that replica's weights and Adam state at
some commit N (its ``version``) while the swarm keeps training (checkfree.swarm.node.recovering, rule
``replica``). The commits it missed are then applied bit for bit as the serving replicas applied them: each
serving replica keeps, after each commit, the averaged and clipped gradient its optimizer stepped with, for the
last :data:`UPDATES_KEPT` iterations (:class:`UpdateKeeper`), with ω (the unclipped norm of that gradient, the
``grad_norm`` a replica reports). The replacement asks for "the update of iteration i" (a WEIGHTS_REQUEST with
``update`` = i), checks the answer (:func:`check_update`) and applies ``opt.step()`` with it
(:func:`apply_update`): Adam with the same weights, moments, step and lr and the same gradient gives the same bits.
An update no longer kept is answered ``not_kept``: the replacement has fallen more than :data:`UPDATES_KEPT`
commits behind and gives up (``recovery_failed``); the supervisor starts another, which copies again.

Memory (checkfree.memory ``swarm_node_estimate``): :data:`UPDATES_KEPT` stage-sized fp32 gradients per node.
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable

import torch

from checkfree.memory import SWARM_UPDATES_KEPT
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.context import NodeContext, StageState
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

log = logging.getLogger(__name__)

UPDATES_KEPT = SWARM_UPDATES_KEPT
"""Iterations whose update a serving replica keeps for a catching-up replacement (memory: this many stage-sized
fp32 gradients per node). A replacement whose copy is older re-copies."""
NOT_YET_WAIT_S = 0.05
"""Seconds before a replacement asks again for an update its source has not stepped yet."""


class UpdateKeeper:
    """The last :data:`UPDATES_KEPT` updates of a serving replica: iteration → (gradient by parameter name, ω).

    The gradient is what ``opt.step()`` stepped with (averaged over the stage's pipelines, clipped); parameters
    without a gradient are absent (Adam skips them)."""

    def __init__(self, kept: int = UPDATES_KEPT) -> None:
        self.kept = kept
        self.updates: dict[int, tuple[dict[str, torch.Tensor], float]] = {}

    def keep(self, iteration: int, module: torch.nn.Module, grad_norm: float) -> None:
        """Keep the gradient in ``module``'s ``.grad`` as the update of ``iteration`` (before the step zeroes it)."""
        grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
        self.updates[iteration] = (grads, grad_norm)
        for old in sorted(self.updates)[: -self.kept]:
            del self.updates[old]

    def get(self, iteration: int) -> tuple[dict[str, torch.Tensor], float] | None:
        return self.updates.get(iteration)

    def clear(self) -> None:
        """Forget every update (a rollback or a new copy: the history they belong to is gone)."""
        self.updates.clear()


def answer_update_request(ctx: NodeContext, msg: Message, state: StageState, keeper: UpdateKeeper) -> None:
    """Answer a peer's request for the update of iteration ``msg.meta["update"]``: the kept gradient (``g.*``),
    ω and this node's version; or ``error`` ``not_yet`` (this node has not stepped it), ``not_kept`` (too old) or
    ``wrong stage``. The caller checked that the sender is a listed peer of this stage and that this node serves."""
    meta = msg.meta
    i = int(meta["update"])
    reply = {"request": meta["request"], "update": i, "version": state.version}
    if meta["stage"] != ctx.stage:
        ctx.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "error": "wrong stage"})
        return
    kept = keeper.get(i) if state.version > i else None
    if kept is None:
        why = "not_yet" if state.version <= i else "not_kept"
        ctx.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "error": why})
        return
    grads, norm = kept
    tensors = {f"g.{n}": g for n, g in grads.items()}
    ctx.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta={**reply, "grad_norm": norm}, tensors=tensors)


def check_update(
    msg: Message, module: torch.nn.Module, iteration: int, stage: int
) -> dict[str, torch.Tensor]:
    """The gradient of an update answer, checked: the iteration and stage asked, ω finite, only ``g.<param>``
    tensors of this stage's parameters with their shapes and dtypes, finite values. Returns name → gradient.

    Raises:
        ProtocolError: naming what does not fit.
    """
    meta, source = msg.meta, f"node {msg.sender}"
    if meta.get("update") != iteration:
        raise ProtocolError(
            f"{source} sent the update of iteration {meta.get('update')}; asked for {iteration}"
        )
    if meta.get("stage") != stage:
        raise ProtocolError(f"{source} sent an update of stage {meta.get('stage')}; asked for stage {stage}")
    norm = meta.get("grad_norm")
    if not isinstance(norm, (int, float)) or not math.isfinite(norm):
        raise ProtocolError(f"{source} sent an update without a finite grad_norm")
    if any(not k.startswith("g.") for k in msg.tensors):
        raise ProtocolError(f"{source} sent an update with tensors other than gradients")
    grads = W.split(msg.tensors, "g")
    params = dict(module.named_parameters())
    for name, g in grads.items():
        p = params.get(name)
        if p is None or g.shape != p.shape or g.dtype != p.dtype:
            raise ProtocolError(f"update entry {name!r} from {source} does not fit this stage")
    if not grads:
        raise ProtocolError(f"{source} sent an empty update")
    W.check_finite(grads, source)
    return grads


def apply_update(state: StageState, grads: dict[str, torch.Tensor], grad_norm: float, iteration: int) -> None:
    """Step ``state``'s Adam with the update of ``iteration`` (the serving replicas' commit of it): its version
    becomes ``iteration + 1`` and ω ``grad_norm``.

    Raises:
        ValueError: ``state`` is not at version ``iteration`` (an update applied out of order).
    """
    if state.version != iteration:
        raise ValueError(f"update of iteration {iteration} on weights of version {state.version}")
    for name, p in state.module.named_parameters():
        g = grads.get(name)
        p.grad = None if g is None else g.to(p.device).clone()
    state.opt.step()
    state.opt.zero_grad(set_to_none=True)
    state.version, state.grad_norm = iteration + 1, float(grad_norm)


class CatchUp:
    """Bring ``state`` from its version to ``target`` with the updates of serving replicas of this stage.

    Args:
        ctx: this node (its stage, the serving replicas: sources; ``send``). cfg: ``request_timeout`` and
            ``max_attempts`` bound each request. state: the copied stage (stepped in place).
        target: the version to reach (the swarm's committed iterations; raised by :meth:`extend`).
        reject: counts a peer message that does not fit. on_done: called once ``state.version == target``.
        on_fail: the reason when it gives up (a source answered ``not_kept``, or no answer after
            ``max_attempts`` tries per source).
    """

    def __init__(
        self,
        ctx: NodeContext,
        cfg: SwarmConfig,
        state: StageState,
        target: int,
        reject: Callable[[Message, str], None],
        on_done: Callable[[], None],
        on_fail: Callable[[str], None],
    ) -> None:
        self.ctx, self.cfg, self.state, self.target = ctx, cfg, state, target
        self.reject, self.on_done, self.on_fail = reject, on_done, on_fail
        self.request: dict[str, object] | None = None
        self.tries = 0
        self.resend_at: float | None = None
        self.finished = False
        self.applied = 0
        self.not_yet_since: float | None = None
        """When a source first answered ``not_yet`` for the update asked (None: it did not)."""

    def sources(self) -> list[int]:
        """The serving replicas of this stage still in the peer table (never itself)."""
        m = self.ctx.membership
        return [n for n in m.serving(self.ctx.stage) if n != self.ctx.node_id and n in m.peers]

    def extend(self, target: int) -> None:
        self.target = max(self.target, target)

    def start(self) -> None:
        self._next()

    def _next(self) -> None:
        if self.state.version >= self.target:
            self.finished, self.request = True, None
            self.on_done()
            return
        self._send()

    def _send(self) -> None:
        sources = self.sources()
        if not sources:
            self._fail("no serving replica of its stage to catch up from")
            return
        self.tries += 1
        if self.tries > self.cfg.max_attempts * len(sources):
            self._fail(
                f"the update of iteration {self.state.version} not obtained after {self.tries - 1} requests"
            )
            return
        target = sources[self.tries % len(sources)]
        rid = secrets.token_hex(16)
        self.request = {
            "id": rid,
            "target": target,
            "iteration": self.state.version,
            "deadline": time.monotonic() + self.cfg.request_timeout,
        }
        self.resend_at = None
        meta = {"stage": self.ctx.stage, "request": rid, "update": self.state.version}
        self.ctx.send(target, MessageType.WEIGHTS_REQUEST, meta=meta)

    def _fail(self, why: str) -> None:
        self.finished, self.request = True, None
        self.on_fail(why)

    def tick(self) -> None:
        if self.finished:
            return
        now = time.monotonic()
        if self.resend_at is not None and now >= self.resend_at:
            self._send()
        elif self.request is not None and now > float(self.request["deadline"]):  # type: ignore[arg-type]
            self._send()

    def owns(self, msg: Message) -> bool:
        """Whether ``msg`` answers this task's open request (its id, from the node asked)."""
        req = self.request
        return req is not None and msg.meta.get("request") == req["id"] and msg.sender == req["target"]

    def on_response(self, msg: Message) -> None:
        """Apply a valid update and ask for the next; ``not_yet`` asks again shortly, ``not_kept`` gives up.

        Raises:
            ProtocolError: the answer does not fit (after the request was moved to another source).
        """
        req = self.request
        assert req is not None
        self.request = None
        error = msg.meta.get("error")
        if error == "not_yet":  # the source has not taken the commit yet: ask again shortly, within a bound
            now = time.monotonic()
            self.not_yet_since = self.not_yet_since or now
            if now - self.not_yet_since > self.cfg.request_timeout:
                self._fail(f"the update of iteration {req['iteration']} not stepped by its sources in time")
                return
            self.tries -= 1
            self.resend_at = now + NOT_YET_WAIT_S
            return
        if error is not None:
            if error == "not_kept":
                self._fail(f"the update of iteration {req['iteration']} is no longer kept: copy again")
            else:
                self._send()
            return
        if msg.sender not in self.ctx.membership.serving(self.ctx.stage):
            self._send()
            raise ProtocolError(
                f"an update from node {msg.sender}, no serving replica of stage {self.ctx.stage}"
            )
        try:
            grads = check_update(msg, self.state.module, int(req["iteration"]), self.ctx.stage)  # type: ignore[call-overload]
        except ProtocolError:
            self._send()
            raise
        apply_update(self.state, grads, float(msg.meta["grad_norm"]), int(req["iteration"]))  # type: ignore[call-overload]
        self.applied += 1
        self.tries, self.not_yet_since = 0, None
        self._next()
