"""A node's side of one iteration, driven by the supervisor's CONTROL commands (one *epoch* per attempt).

``begin`` (stage 0 starts its pipeline, checkfree.swarm.node.driver) → every node forwards/backwards what
arrives → stage 0 sends ITERATION_END → ``sync``: the replicas of each stage average their gradients
(checkfree.swarm.node.gradient_sync), record the unclipped norm ω (docs/paper.md §2), clip and report ``ready`` →
``commit``: Adam step (and, on checkpoint iterations, the designated replica ships weights + Adam state to
storage) → ``committed``. ``abort`` drops the epoch's activations and gradients; nothing has been stepped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from checkfree.swarm.node.context import Progress, Send
from checkfree.swarm.node.driver import PipelineDriver
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.parts import NodeParts
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError


class IterationCommands:
    """The ``begin`` / ``sync`` / ``commit`` / ``abort`` / ``checkpoint`` handlers of one node.

    Args:
        node_id: this node.
        parts: its stage, worker, gradient exchange, stage-0 copies and pipeline part.
        progress: its epoch, iteration and highest plausible version (updated here).
        membership: the serving replicas (``begin`` brings the supervisor's list).
        send: sends ``committed`` to the supervisor.
        dispatch: replays a buffered message of the epoch that begins.
        serving: whether this node serves (a replacement still fetching pushes no stage-0 copies).
        checkpoint: ships weights + Adam state to the storage node.
        report: the cumulative stats a ``committed`` carries.
    """

    def __init__(
        self,
        node_id: int,
        parts: NodeParts,
        progress: Progress,
        membership: Membership,
        send: Send,
        dispatch: Callable[[Message], None],
        serving: Callable[[], bool],
        checkpoint: Callable[[], None],
        report: Callable[[], dict[str, Any]],
    ) -> None:
        self.node_id, self.parts, self.progress, self.membership = node_id, parts, progress, membership
        self.send, self.dispatch, self.serving = send, dispatch, serving
        self.checkpoint, self.report = checkpoint, report
        self.step_s = 0.0
        """CPU seconds spent in optimizer steps."""

    def table(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """CONTROL command → handler."""
        return {
            "begin": self.begin,
            "sync": self.sync,
            "commit": self.commit,
            "abort": self.abort,
            "checkpoint": self.on_checkpoint,
        }

    def begin(self, meta: dict[str, Any]) -> None:
        progress, parts = self.progress, self.parts
        if meta["epoch"] <= progress.epoch:
            raise ProtocolError(
                f"begin of epoch {meta['epoch']}; this node is at epoch {progress.epoch} already"
            )
        progress.epoch, progress.iteration = meta["epoch"], meta["iteration"]
        progress.max_version = max(progress.max_version, progress.iteration)
        self.membership.set_members(meta["members"])
        parts.worker.reset()
        parts.gradients.reset()
        if self.serving():
            parts.stage0_copies.push()  # holders that joined since the last step
        if isinstance(parts.pipeline, PipelineDriver):
            parts.pipeline.begin()
        progress.future.drop_before(progress.epoch)
        for msg in progress.future.take(lambda m: m.meta.get("epoch") == progress.epoch):
            self.dispatch(msg)

    def sync(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] == self.progress.epoch:
            self.parts.gradients.start()

    def commit(self, meta: dict[str, Any]) -> None:
        epoch, parts, state = self.progress.epoch, self.parts, self.parts.state
        if meta["epoch"] != epoch or parts.gradients.reduced != epoch:
            raise ProtocolError(
                f"commit of epoch {meta['epoch']}; this node is at epoch {epoch} and has reduced the "
                f"gradients of epoch {parts.gradients.reduced}"
            )
        parts.gradients.reduced = -1  # one step per epoch
        t0 = time.thread_time()
        state.opt.step()
        state.opt.zero_grad(set_to_none=True)
        self.step_s += time.thread_time() - t0  # CPU seconds
        state.version, state.grad_norm = meta["iteration"] + 1, parts.gradients.norm
        self.progress.max_version = max(self.progress.max_version, state.version)
        if self.node_id in meta.get("checkpoint_senders", []):
            self.checkpoint()
        if self.serving():
            parts.stage0_copies.push()
        parts.worker.reset()
        done = control("committed", epoch=epoch, **self.report())
        self.send(SUPERVISOR_ID, MessageType.CONTROL, self.progress.iteration, meta=done)

    def abort(self, meta: dict[str, Any]) -> None:
        if meta["epoch"] == self.progress.epoch:
            self.parts.worker.reset()
            self.parts.gradients.reset()
            if isinstance(self.parts.pipeline, PipelineDriver):
                self.parts.pipeline.abort()

    def on_checkpoint(self, meta: dict[str, Any]) -> None:
        if self.node_id in meta["checkpoint_senders"]:
            self.checkpoint()
