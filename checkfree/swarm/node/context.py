"""The small state objects a swarm node's parts share, and the one :class:`NodeContext` that hands them over.

A node (checkfree.swarm.node.node) is these objects plus parts that receive them: :class:`StageState` (the stage
replica it trains: module, Adam, weights version, last gradient norm ω), :class:`AttemptClock` (where the swarm
is: attempt, iteration, the highest plausible weights version, early messages of a later attempt), the peer table
(checkfree.swarm.node.membership) and a :class:`Send` callable. :class:`NodeContext` bundles the node's id and
stage with its clock, peer table and ``send``; every part gets that one object. The parts (the gradient
exchange of checkfree.swarm.node.gradient_sync, the stage-0 copies of checkfree.swarm.node.stage0_copies, stage
0's checkfree.swarm.node.driver, a transformer stage's checkfree.swarm.node.relay, the iteration commands of
checkfree.swarm.node.iteration and the weights fetch of checkfree.swarm.node.recovering) never hold the node
itself, so each can be built and tested alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

FUTURE_ATTEMPTS = 4
"""An attempt more than this far ahead of the node's last ``begin`` is implausible (dropped and counted)."""


class Send(Protocol):
    """Send one message to a peer (``SUPERVISOR_ID`` for the supervisor); a peer gone is logged, not raised.

    ``meta`` gets the sender's ``stage`` unless it is a CONTROL message or names one.
    """

    def __call__(
        self,
        peer: int,
        mtype: MessageType,
        iteration: int = -1,
        microbatch: int = -1,
        meta: dict[str, Any] | None = None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> None: ...


@dataclass
class StageState:
    """The stage replica a node trains.

    Attributes:
        module: the stage's parameters (checkfree.model stage module).
        opt: its Adam optimizer.
        version: iterations whose step these weights include (0 = initialisation).
        grad_norm: ω, the unclipped norm of the last averaged gradient (1.0 before any step, paper §4.1).
    """

    module: torch.nn.Module
    opt: torch.optim.Optimizer
    version: int = 0
    grad_norm: float = 1.0

    def adopt(self, other: StageState) -> None:
        """Take over a rebuilt state (a finished recovery or rollback); parts holding this object see it."""
        self.module, self.opt, self.version, self.grad_norm = (
            other.module,
            other.opt,
            other.version,
            other.grad_norm,
        )

    def weights_meta(self) -> dict[str, Any]:
        """The scalars that travel with the weights: version, ω, Adam's lr and step."""
        return {
            "version": self.version,
            "grad_norm": self.grad_norm,
            "lr": W.current_lr(self.opt),
            "step": W.adam_step(self.opt),
        }


@dataclass
class AttemptClock:
    """Where the swarm is, as this node knows it from the supervisor's commands: its attempt and iteration.

    Attributes:
        attempt: the number of the last ``begin``'s attempt (one try at an iteration); -1 before any.
        iteration: the last ``begin``'s iteration; -1 before any.
        reroutes: the ``reroute`` commands of the current attempt taken so far (a peer's FORWARD / BACKWARD
            stamped with more waits in ``future`` until they come; checkfree.swarm.node.iteration).
        max_version: the highest weights version a peer may claim (iterations the supervisor has begun).
        future: messages of an attempt this node has not begun yet.
    """

    attempt: int = -1
    iteration: int = -1
    reroutes: int = 0
    max_version: int = 0
    future: FutureBuffer = field(default_factory=FutureBuffer)

    def plausible_version(self, version: int) -> bool:
        """A weights version a peer may hold: not ahead of the iterations the supervisor has begun."""
        return version <= max(self.max_version, self.iteration + 1)

    def waits_for_reroute(self, msg: Message, limit: int) -> bool:
        """Whether ``msg`` (of the current attempt) was sent on a ``reroute`` this node has not taken yet (its
        ``reroutes`` is higher): then it is kept in ``future`` until that re-route comes
        (checkfree.swarm.node.iteration).

        Raises:
            ProtocolError: it is more than ``limit`` re-routes ahead (each takes a node out: at most the swarm's
                nodes), or the buffer for early messages is full.
        """
        reroutes = msg.meta.get("reroutes", 0)
        if reroutes <= self.reroutes:
            return False
        if reroutes > self.reroutes + limit:
            raise ProtocolError(f"reroute {reroutes} is implausibly far ahead of {self.reroutes}")
        self.future.add(msg)
        return True

    def attempt_of(self, msg: Message) -> int | None:
        """The message's attempt; None (dropped) when stale, buffered (None) when it is ahead of this node.

        Raises:
            ProtocolError: the attempt is more than FUTURE_ATTEMPTS ahead of the supervisor's last ``begin``, or
                the buffer for future attempts is full (count or bytes).
        """
        attempt = msg.meta["attempt"]
        if attempt > self.attempt:
            if attempt > self.attempt + FUTURE_ATTEMPTS:
                raise ProtocolError(
                    f"attempt {attempt} is implausibly far ahead of this node's {self.attempt}"
                )
            self.future.add(msg)
            return None
        return attempt if attempt == self.attempt else None


@dataclass(frozen=True)
class NodeContext:
    """What every part of a node needs: who it is, where the swarm is, who serves what, and how to send.

    Attributes:
        node_id: this node.
        stage: the stage it holds.
        clock: its attempt, iteration and highest plausible weights version (updated by ``begin`` / ``commit``).
        membership: the peer table and the serving replicas of each stage.
        send: sends one message to a peer or the supervisor.
    """

    node_id: int
    stage: int
    clock: AttemptClock
    membership: Membership
    send: Send
