"""Messages that arrive before a node can use them, kept in a buffer bounded in count and bytes.

A node keeps FORWARD/BACKWARD/GRADIENTS of an attempt it has not begun yet (a peer got ``begin`` first), and
WEIGHTS_REQUESTs from peers the supervisor has not listed yet, that arrive before it serves, or whose grant has
not arrived yet (checkfree.swarm.node.parts; at most a few per sender). A flood of either is dropped and counted,
never kept for the rest of the run (checkfree.swarm.node.node).
"""

from __future__ import annotations

from collections.abc import Callable

from checkfree.swarm.wire.protocol import Message, ProtocolError

MAX_FUTURE = 2000
"""Early messages (a not-yet-begun attempt) buffered at most; more are dropped."""
MAX_FUTURE_BYTES = 512 * 1024**2
"""Tensor bytes of early messages buffered at most."""


class FutureBuffer:
    """Messages that arrived early (a later attempt, a requester not yet listed or granted), bounded in count and
    bytes, and with ``per_sender`` in messages per sender (one sender cannot fill it for the others)."""

    def __init__(
        self, max_messages: int = MAX_FUTURE, max_bytes: int = MAX_FUTURE_BYTES, per_sender: int | None = None
    ) -> None:
        self.max_messages, self.max_bytes, self.per_sender = max_messages, max_bytes, per_sender
        self.messages: list[Message] = []
        self.nbytes = 0

    @staticmethod
    def _size(msg: Message) -> int:
        return sum(t.numel() * t.element_size() for t in msg.tensors.values())

    def add(self, msg: Message) -> None:
        """Keep ``msg``.

        Raises:
            ProtocolError: the buffer is full, or holds ``per_sender`` messages of this sender already (the
                message is dropped and counted by the caller).
        """
        size = self._size(msg)
        if len(self.messages) >= self.max_messages or self.nbytes + size > self.max_bytes:
            raise ProtocolError(
                f"the buffer for early messages is full ({len(self.messages)} messages, {self.nbytes} bytes)"
            )
        if (
            self.per_sender is not None
            and sum(m.sender == msg.sender for m in self.messages) >= self.per_sender
        ):
            raise ProtocolError(
                f"the buffer for early messages holds {self.per_sender} of node {msg.sender} already"
            )
        self.messages.append(msg)
        self.nbytes += size

    def take(self, keep: Callable[[Message], bool]) -> list[Message]:
        taken = [m for m in self.messages if keep(m)]
        if taken:
            self.messages = [m for m in self.messages if not keep(m)]
            self.nbytes = sum(self._size(m) for m in self.messages)
        return taken

    def drop_before(self, attempt: int) -> None:
        """Forget messages of attempts older than ``attempt``."""
        self.take(lambda m: isinstance(m.meta.get("attempt"), int) and m.meta["attempt"] < attempt)
