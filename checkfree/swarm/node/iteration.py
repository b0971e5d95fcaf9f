"""A node's side of one iteration, driven by the supervisor's CONTROL commands (one *attempt* per try at it).

``begin`` (stage 0 starts its pipeline, checkfree.swarm.node.driver) → every node forwards/backwards what
arrives → stage 0 sends ITERATION_END → ``sync``: the replicas of each stage average their gradients
(checkfree.swarm.node.gradient_sync), record the unclipped norm ω (docs/paper.md §2), clip and report ``ready`` →
``commit``: Adam step (and, on checkpoint iterations, the designated replica ships weights + Adam state to
storage) → ``committed`` (with the attempt's mean compute seconds per microbatch, ``microbatch_s``, which the
supervisor's speed estimates take; checkfree.swarm.supervisor.speeds). ``begin`` carries the slowdown factors of the
emulation (checkfree.swarm.slowdown). ``abort`` drops the attempt's activations and gradients; nothing has been stepped.
``reroute`` (a replica died before ``sync`` and every stage still serves): the pipelines whose route crossed it go
again on their new route, the others go on (issue 39 point 1; checkfree.swarm.reroute).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from checkfree.swarm.node.catch_up import UpdateKeeper
from checkfree.swarm.node.context import NodeContext
from checkfree.swarm.node.driver import PipelineDriver
from checkfree.swarm.node.parts import NodeParts
from checkfree.swarm.node.relay import StageRelay
from checkfree.swarm.reroute import moved as reroute_moved
from checkfree.swarm.reroute import node_of
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

log = logging.getLogger(__name__)


class IterationCommands:
    """The ``begin`` / ``sync`` / ``commit`` / ``abort`` / ``checkpoint`` handlers of one node.

    Args:
        ctx: this node, its attempt, iteration and highest plausible version (updated here), the serving
            replicas (``begin`` brings the supervisor's list), and the ``send`` of ``committed``.
        parts: its stage, worker, gradient exchange, stage-0 copies and pipeline part.
        dispatch: replays a buffered message of the attempt that begins.
        serving: whether this node serves (a replacement still fetching pushes no stage-0 copies).
        checkpoint: ships weights + Adam state to the storage node.
        report: the cumulative stats a ``committed`` carries.
    """

    def __init__(
        self,
        ctx: NodeContext,
        parts: NodeParts,
        dispatch: Callable[[Message], None],
        serving: Callable[[], bool],
        checkpoint: Callable[[], None],
        report: Callable[[], dict[str, Any]],
        keeper: UpdateKeeper | None = None,
        missed: Callable[[int], None] | None = None,
    ) -> None:
        self.ctx, self.parts, self.dispatch, self.serving = ctx, parts, dispatch, serving
        self.checkpoint, self.report = checkpoint, report
        self.keeper, self.missed = keeper, missed
        """``keeper``: the updates kept for catching-up replacements (checkfree.swarm.node.catch_up); ``missed``:
        called with the iteration of a ``commit`` of an attempt this node is no member of (a replacement that
        recovers in the background catches up with it)."""
        self.step_s = 0.0
        """CPU seconds spent in optimizer steps."""
        self.taken: dict[int, PipelineDriver] = {}
        """Stage 0: the pipelines this node took over in the current attempt (their stage-0 node died) → driver."""

    def member(self) -> bool:
        """Whether this node is a member of the attempt's ``begin`` (a replacement recovering in the background,
        issue 39 point 3, is not: it neither exchanges gradients nor steps, and pushes no stage-0 copies)."""
        return self.ctx.node_id in self.ctx.membership.at_begin().get(self.ctx.stage, [])

    def drivers(self) -> list[PipelineDriver]:
        """Stage 0: this node's pipeline driver and those of the pipelines it took over; [] on other stages."""
        own = self.parts.pipeline
        return ([own] if isinstance(own, PipelineDriver) else []) + list(self.taken.values())

    def handler_of(self, pipeline: int) -> PipelineDriver | StageRelay:
        """What runs a FORWARD / BACKWARD of ``pipeline`` here: the driver of a pipeline taken over, else the
        node's own driver (stage 0) or relay."""
        return self.taken.get(pipeline, self.parts.pipeline)

    def _drop_taken(self) -> None:
        for driver in self.taken.values():
            driver.abort()
        self.taken.clear()

    def table(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """CONTROL command → handler."""
        return {
            "begin": self.begin,
            "sync": self.sync,
            "commit": self.commit,
            "abort": self.abort,
            "reroute": self.reroute,
            "checkpoint": self.on_checkpoint,
        }

    def begin(self, meta: dict[str, Any]) -> None:
        clock, parts = self.ctx.clock, self.parts
        if meta["attempt"] <= clock.attempt:
            raise ProtocolError(
                f"begin of attempt {meta['attempt']}; this node is at attempt {clock.attempt} already"
            )
        clock.attempt, clock.iteration = meta["attempt"], meta["iteration"]
        clock.reroutes = 0
        clock.max_version = max(clock.max_version, clock.iteration)
        self.ctx.membership.set_members(meta["members"])
        parts.worker.reset()
        parts.worker.slowdown = float(meta.get("slowdown", {}).get(str(self.ctx.node_id), 1.0))
        parts.gradients.reset()
        self._drop_taken()
        if self.serving() and self.member():
            parts.stage0_copies.push()  # holders that joined since the last step
        if isinstance(parts.pipeline, PipelineDriver):
            parts.pipeline.begin()
        clock.future.drop_before(clock.attempt)
        for msg in clock.future.take(lambda m: m.meta.get("attempt") == clock.attempt):
            self.dispatch(msg)

    def reroute(self, meta: dict[str, Any]) -> None:
        """A replica died mid-attempt and every stage still has a serving one (issue 39 point 1): take the new
        serving lists (the ``begin``'s less the dead), drop the saved activations of the pipelines whose route
        changed (checkfree.swarm.reroute.moved) and the chains of those this node no longer carries, let stage 0
        send those pipelines' microbatches again, then take the messages that waited for this re-route.

        Raises:
            ProtocolError: the command is out of sequence (its ``seq`` is not the next) or adds a node.
        """
        clock, parts, membership = self.ctx.clock, self.parts, self.ctx.membership
        if meta["attempt"] != clock.attempt:
            return  # an attempt that is over (or, impossibly, one not begun): nothing to move
        if meta["seq"] != clock.reroutes + 1:
            raise ProtocolError(f"reroute {meta['seq']} of attempt {clock.attempt}; {clock.reroutes} taken")
        before = membership.members
        membership.rerouted(meta["members"])
        begun, after = membership.at_begin(), membership.members
        moved = reroute_moved(begun, before, after, parts.gradients.cfg.n_stages)
        clock.reroutes = meta["seq"]
        parts.worker.forget(moved)
        me, stage = self.ctx.node_id, self.ctx.stage
        for p in moved:
            if node_of(p, stage, begun, after) != me:
                parts.worker.gradients.drop(p)
        log.info(
            "node %d: attempt %d re-routed (dead %s): pipelines %s move",
            me,
            clock.attempt,
            meta["dead"],
            moved,
        )
        for p in moved:  # a pipeline taken over here whose stage-0 node is now another (a second death)
            if p in self.taken and node_of(p, 0, begun, after) != me:
                self.taken.pop(p).abort()
        for driver in self.drivers():
            driver.rerouted(moved)
        driving = isinstance(parts.pipeline, PipelineDriver) and parts.pipeline.running
        own = parts.pipeline.pipeline if driving else None
        for p in moved:  # a pipeline whose stage-0 node died and that the routes give this node
            if parts.takeover is not None and p != own and p not in self.taken:
                if node_of(p, 0, begun, after) == me:
                    self.taken[p] = driver = parts.takeover(p)
                    driver.take_over(p)
        for msg in clock.future.take(
            lambda m: m.meta.get("attempt") == clock.attempt and m.meta.get("reroutes", 0) <= clock.reroutes
        ):
            self.dispatch(msg)

    def sync(self, meta: dict[str, Any]) -> None:
        if meta["attempt"] == self.ctx.clock.attempt and self.member():
            self.parts.worker.settle()  # the microbatches' gradients, summed in id order, into .grad
            self.parts.gradients.start()

    def commit(self, meta: dict[str, Any]) -> None:
        clock, parts, state = self.ctx.clock, self.parts, self.parts.state
        attempt = clock.attempt
        if self.missed is not None and not self.member() and parts.gradients.reduced != attempt:
            self.missed(meta["iteration"])  # no member of this attempt: catch up with its update
            return
        if meta["attempt"] != attempt or parts.gradients.reduced != attempt:
            raise ProtocolError(
                f"commit of attempt {meta['attempt']}; this node is at attempt {attempt} and has reduced the "
                f"gradients of attempt {parts.gradients.reduced}"
            )
        parts.gradients.reduced = -1  # one step per attempt
        if self.keeper is not None:  # what a catching-up replacement will step with (before zero_grad)
            self.keeper.keep(meta["iteration"], state.module, parts.gradients.norm)
        t0 = time.thread_time()
        state.opt.step()
        state.opt.zero_grad(set_to_none=True)
        self.step_s += time.thread_time() - t0  # CPU seconds
        state.version, state.grad_norm = meta["iteration"] + 1, parts.gradients.norm
        clock.max_version = max(clock.max_version, state.version)
        if self.ctx.node_id in meta.get("checkpoint_senders", []):
            self.checkpoint()
        if self.serving():
            parts.stage0_copies.push()
        speed = parts.worker.microbatch_seconds()  # this attempt's, before the reset drops it
        parts.worker.reset()
        done = control(
            "committed",
            attempt=attempt,
            **({"microbatch_s": speed} if speed is not None else {}),
            **self.report(),
        )
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, clock.iteration, meta=done)

    def hold(self) -> int | None:
        """The supervisor is away, or a resumed one asks where this node is (checkfree.swarm.node.supervisor_watch):
        drop the attempt in flight (its activations and gradients, stage 0's pipeline), unless its gradients were
        averaged and await ``commit``: those are kept, for the commit may have been decided and some replicas may
        have stepped (a resumed supervisor finishes it, checkfree.swarm.supervisor.adoption). Returns that
        attempt, or None. Nothing has stepped either way."""
        clock, parts = self.ctx.clock, self.parts
        if isinstance(parts.pipeline, PipelineDriver):
            parts.pipeline.abort()
        self._drop_taken()
        if clock.attempt >= 0 and parts.gradients.reduced == clock.attempt:
            return clock.attempt
        parts.worker.reset()
        parts.gradients.reset()
        return None

    def abort(self, meta: dict[str, Any]) -> None:
        if meta["attempt"] == self.ctx.clock.attempt:
            self.parts.worker.reset()
            self.parts.gradients.reset()
            if isinstance(self.parts.pipeline, PipelineDriver):
                self.parts.pipeline.abort()
            self._drop_taken()

    def on_checkpoint(self, meta: dict[str, Any]) -> None:
        if self.ctx.node_id in meta["checkpoint_senders"]:
            self.checkpoint()
