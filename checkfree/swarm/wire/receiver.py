"""The transport's receive side: who reads the PULL socket, and the checks every received message passes.

Whoever holds the PULL socket (the application thread while it waits in ``recv``, else the receiver thread,
once the application has been away for ``HANDOFF_S``) validates every message: the wire format
(checkfree.swarm.wire.protocol), the sender bound to the authenticated CURVE key, and the ``validate`` hook (the
control-plane schemas). A message that fails is logged, counted and dropped; the node keeps serving. Valid
messages record liveness; heartbeats are consumed here; the receiver thread queues the rest for ``recv``.
Saving the two thread hops per message (socket → thread → queue → application) halves the 8-byte round trip.

Back-pressure: when the application stops calling ``recv`` the inbox fills and the receiver thread stops
reading, so the PULL and then the sender's PUSH buffers fill and the sender keeps its messages.
"""

from __future__ import annotations

import logging
import math
import queue
import struct
import threading
from collections.abc import Callable

import zmq

from checkfree.swarm.wire.auth import Identity
from checkfree.swarm.wire.links import Links, Stats, TransportError
from checkfree.swarm.wire.protocol import HEADER, Message, MessageType, ProtocolError, decode, nbytes
from checkfree.swarm.wire.sender import POLL_INTERVAL_S, RETRY_INTERVAL_S

log = logging.getLogger(__name__)

HANDOFF_S = 0.02
"""The receiver thread reads the socket once the application has been out of ``recv`` this long, seconds."""


class Receiver:
    """Reads and checks the PULL socket for the application (see the module docstring).

    Args:
        pull: the bound PULL socket. links: the shared peer table (for LEAVE and the closing flag).
        stats: the counters. identity: CURVE keypair and keyring, or None (no sender binding).
        validate: raises ProtocolError on a message to drop. max_message_bytes: largest message accepted.
        inbox_size: messages the receiver thread keeps for ``recv``.
    """

    def __init__(
        self,
        pull: zmq.Socket,
        links: Links,
        stats: Stats,
        identity: Identity | None,
        validate: Callable[[Message], None] | None,
        max_message_bytes: int,
        inbox_size: int,
    ) -> None:
        self.pull, self.links, self.stats, self.identity = pull, links, stats, identity
        self.validate, self.max_message_bytes = validate, max_message_bytes
        self.node_id, self.clock = links.node_id, links.clock
        self.inbox: queue.Queue[Message] = queue.Queue(maxsize=inbox_size)
        self.pull_lock = threading.Lock()
        """Whoever holds it may read the PULL socket."""
        self._app_reading = False  # the application is inside recv() and reads the socket itself
        self._app_left_at = -math.inf
        self._bg_event = threading.Event()
        name = f"inproc://wake-{self.node_id}-{id(self)}"
        self._wake_in = links.ctx.socket(zmq.PAIR)  # the receiver thread polls it: "give me the socket"
        self._wake_in.bind(name)
        self._wake_out = links.ctx.socket(zmq.PAIR)  # used by the thread inside recv()
        self._wake_out.connect(name)
        self.thread = threading.Thread(target=self._loop, name=f"transport-{self.node_id}-recv", daemon=True)

    def recv(self, timeout: float) -> Message | None:
        """Next valid message (heartbeats excluded), or ``None`` after ``timeout`` seconds (one thread at a
        time; see ``Transport.recv``)."""
        if not math.isfinite(timeout) or timeout < 0:
            raise TransportError(f"recv timeout is {timeout!r}; expected a finite number of seconds >= 0.")
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            pass
        deadline = self.clock() + timeout
        self._app_reading = True
        try:
            if not self.pull_lock.acquire(blocking=False):
                try:
                    self._wake_out.send(b"", flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is pending already
                if not self.pull_lock.acquire(timeout=max(timeout, POLL_INTERVAL_S)):
                    return None
            try:
                return self._read(deadline)
            finally:
                self.pull_lock.release()
        finally:
            self._app_left_at = self.clock()
            self._app_reading = False

    def close_sockets(self) -> None:
        """Close the wake-up pair (the threads have stopped; the caller holds ``pull_lock``)."""
        self._wake_in.close(0)
        self._wake_out.close(0)

    def _read(self, deadline: float) -> Message | None:
        """The caller holds ``pull_lock``: queued messages first, then the socket until ``deadline``."""
        try:
            return self.inbox.get_nowait()
        except queue.Empty:
            pass
        while not self.links.closing:
            wait = min(max(0.0, deadline - self.clock()), POLL_INTERVAL_S)
            if self.pull.poll(wait * 1000, zmq.POLLIN):
                try:
                    frames = self.pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue
                msg = self.accept(frames)
                if msg is not None:
                    return msg
            elif self.clock() >= deadline:
                return None
        return None

    def _loop(self) -> None:
        """Read the PULL socket while the application is not in ``recv``."""
        poller = zmq.Poller()
        poller.register(self.pull, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self.links.closing:
            if self._app_reading or self.clock() - self._app_left_at < HANDOFF_S:
                self._bg_event.wait(HANDOFF_S)
                continue
            if self.inbox.full():  # the application is not calling recv: stop reading (back-pressure)
                self._bg_event.wait(RETRY_INTERVAL_S)
                continue
            with self.pull_lock:
                events = dict(poller.poll(POLL_INTERVAL_S * 1000))
                if self._wake_in in events:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                    continue
                while not self.links.closing and not self._app_reading and not self.inbox.full():
                    try:
                        frames = self.pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    msg = self.accept(frames)
                    if msg is not None:
                        self.inbox.put_nowait(msg)  # the only producer, and not full: never blocks

    def accept(self, frames: list[zmq.Frame]) -> Message | None:
        """Decode and check one received message; the message for the application, or None (dropped,
        or a heartbeat). Large tensors stay in their frames (``decode(zero_copy=True)``)."""
        try:
            msg = decode(frames, self.max_message_bytes, zero_copy=True)
        except ProtocolError as exc:
            self.stats.drop("malformed")
            log.warning(
                "node %d: dropped a malformed message from %s: %s", self.node_id, describe(frames), exc
            )
            return None
        if self.identity is not None:
            owner = self.identity.keyring.owner(frames[0].get("User-Id"))
            if owner != msg.sender:
                self.stats.drop("spoofed")
                log.warning(
                    "node %d: dropped a %s whose header claims sender %d from the key of %s",
                    self.node_id,
                    msg.type.name,
                    msg.sender,
                    owner,
                )
                return None
        if self.validate is not None:
            try:
                self.validate(msg)
            except ProtocolError as exc:
                self.stats.drop("malformed")
                log.warning("node %d: dropped a %s from %d: %s", self.node_id, msg.type.name, msg.sender, exc)
                return None
        self.stats.count("recv", msg.type, nbytes(frames))
        self.stats.heard(msg.sender, self.clock())
        if msg.type == MessageType.HEARTBEAT:
            return None
        if msg.type == MessageType.LEAVE:
            self.links.mark_left(msg.sender)
        return msg


def describe(frames: list[zmq.Frame]) -> str:
    """'peer 127.0.0.1 (claims sender 5)' from whatever of the header can be read."""
    try:
        where = frames[0].get("Peer-Address")
    except (zmq.ZMQError, AttributeError, IndexError):
        where = "an unknown address"
    try:
        sender = HEADER.unpack(frames[0].buffer)[4]
        return f"{where} (header claims sender {sender})"
    except (struct.error, IndexError, AttributeError):
        return f"{where} (header unreadable)"
