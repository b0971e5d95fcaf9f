"""Fetching one node's weights (tests inspect weights through checkfree.swarm.supervisor.supervisor
``Supervisor.fetch_weights``): the loop keeps serving every other message meanwhile."""

from __future__ import annotations

import secrets

from checkfree.swarm.supervisor.phases.base import Context, Decision, Phase, Turn, act, done
from checkfree.swarm.supervisor.state import SwarmError
from checkfree.swarm.wire.protocol import Message, MessageType


class FetchingWeights(Phase):
    """Ask ``node`` for its stage's weights (or, with ``part``, the CheckFree+ copy of stage 0's "embedding" or
    "head" it holds); the drive returns its WEIGHTS_RESPONSE.

    Raises (from :meth:`expired`):
        SwarmError: no answer within ``timeout`` seconds.
    """

    name = "fetching weights"
    poll_s = 0.05
    police = False

    def __init__(self, node: int, stage: int, timeout: float = 30.0, part: str | None = None) -> None:
        self.node, self.stage, self.timeout, self.part = node, stage, timeout, part
        self.request = secrets.token_hex(16)
        self.answer: Message | None = None

    def enter(self, ctx: Context, now: float) -> Decision:
        self.deadline = now + self.timeout
        meta = {"stage": self.stage, "request": self.request} | ({"part": self.part} if self.part else {})
        return self.stay([act("link", "send", self.node, MessageType.WEIGHTS_REQUEST, meta)])

    def take(self, msg: Message, ctx: Context) -> bool:
        if msg.type == MessageType.WEIGHTS_RESPONSE and msg.meta.get("request") == self.request:
            self.answer = msg
            return True
        return False

    def step(self, ctx: Context, turn: Turn) -> Decision:
        return done(result=self.answer) if self.answer is not None else self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        raise SwarmError(f"node {self.node} did not answer a weights request within {self.timeout:.0f} s.")
