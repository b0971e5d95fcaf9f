"""The transport's send side: the delivery-time heap, per-peer backlogs, heartbeats, and the sender thread.

``submit`` (any thread) books a message on the emulated link (netem) and hands it to the peer's PUSH socket
at once if it is due now and nothing is queued before it for that peer; otherwise it goes on the heap. The
sender thread moves due messages into per-peer backlogs and hands them over in order; a socket that refuses
(EAGAIN: the peer is down or its buffers are full) keeps its backlog, retried every ``RETRY_INTERVAL_S``,
and a message not handed over within ``send_timeout`` seconds of its delivery time is dropped and counted.
Every ``heartbeat_interval`` seconds a HEARTBEAT is queued for every connected peer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field

import zmq

from checkfree.swarm.wire.links import Links, Peer, Stats, TransportError
from checkfree.swarm.wire.netem import NetEm
from checkfree.swarm.wire.protocol import Message, MessageType, encode, nbytes

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 0.002
"""Seconds between retries of a send that found the peer's buffer full or its connection down."""
POLL_INTERVAL_S = 0.05
"""Longest sleep of the background threads, seconds (bounds how long ``close`` waits)."""


@dataclass(order=True)
class Outgoing:
    """One encoded message on its way to a peer (ordered by delivery time, then submission)."""

    deliver_at: float
    seq: int
    peer_id: int = field(compare=False)
    generation: int = field(compare=False)
    mtype: MessageType = field(compare=False)
    frames: list = field(compare=False)
    size: int = field(compare=False)


class Sender:
    """Delivers encoded messages to the peers' PUSH sockets in per-peer order (see the module docstring).

    Args:
        links: the shared peer table (its ``cond`` guards this object's queues too). stats: the counters.
        netem: WAN emulation, or None. heartbeat_interval, send_timeout: seconds.
    """

    def __init__(
        self, links: Links, stats: Stats, netem: NetEm | None, heartbeat_interval: float, send_timeout: float
    ) -> None:
        self.links, self.stats, self.netem = links, stats, netem
        self.heartbeat_interval, self.send_timeout = heartbeat_interval, send_timeout
        self._heap: list[Outgoing] = []
        self._seq = itertools.count()
        self._pending: dict[int, deque[Outgoing]] = {}  # due, in order, per peer (sender thread only)
        self._queued: dict[int, int] = {}  # per peer: messages on the heap or in _pending (under cond)
        node_id = links.node_id
        self.thread = threading.Thread(target=self._loop, name=f"transport-{node_id}-send", daemon=True)

    def submit(self, peer_id: int, mtype: MessageType, frames: list, size: int) -> None:
        """Deliver ``frames`` to ``peer_id`` at its emulated delivery time; never blocks on the network.

        Raises:
            TransportError: ``peer_id`` is not connected, or the transport is closed.
        """
        links = self.links
        with links.cond:
            links.check_open()
            peer = links.peers.get(peer_id)
            if peer is None:
                raise TransportError(
                    f"Peer {peer_id} is not connected; call connect(peer_id, address) first."
                )
            now = links.clock()
            deliver_at = self.netem.reserve(links.node_id, peer_id, size, now) if self.netem else now
            item = Outgoing(deliver_at, next(self._seq), peer_id, peer.generation, mtype, frames, size)
            if deliver_at <= now and not self._queued.get(peer_id) and self._send_now(peer, item):
                return  # due now and nothing ahead of it: no hop through the sender thread
            heapq.heappush(self._heap, item)
            self._queued[peer_id] = self._queued.get(peer_id, 0) + 1
            links.cond.notify()

    def _drop(self, item: Outgoing, reason: str) -> None:
        self.stats.drop("unsent")
        log.warning(
            "node %d: dropped a %s message to peer %d: %s",
            self.links.node_id,
            item.mtype.name,
            item.peer_id,
            reason,
        )

    def _send_now(self, peer: Peer, item: Outgoing) -> bool:
        """Hand ``item`` to its socket from the caller's thread (``cond`` held, so the per-peer order is
        kept); False if the socket would block (the caller queues it for the sender thread)."""
        try:
            with self.links.sock_lock:
                peer.socket.send_multipart(item.frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._drop(item, f"zmq error {exc}")
            return True
        self.stats.count("sent", item.mtype, item.size)
        return True

    def _dequeued(self, peer_id: int) -> None:
        with self.links.cond:
            left = self._queued.get(peer_id, 0) - 1
            if left > 0:
                self._queued[peer_id] = left
            else:
                self._queued.pop(peer_id, None)

    def _queue_heartbeats(self, now: float) -> None:
        links = self.links
        hb = encode(Message(MessageType.HEARTBEAT, links.node_id))
        size = nbytes(hb)
        with links.cond:
            for pid, peer in links.peers.items():
                at = self.netem.latency_only(links.node_id, pid, now) if self.netem else now
                item = Outgoing(at, next(self._seq), pid, peer.generation, MessageType.HEARTBEAT, hb, size)
                heapq.heappush(self._heap, item)
                self._queued[pid] = self._queued.get(pid, 0) + 1

    def _loop(self) -> None:
        links = self.links
        next_heartbeat = links.clock()
        while True:
            with links.cond:
                if links.closing:
                    return
                now = links.clock()
                wake = min(next_heartbeat, self._heap[0].deliver_at if self._heap else math.inf)
                if any(self._pending.values()):
                    wake = min(wake, now + RETRY_INTERVAL_S)
                if wake > now:
                    links.cond.wait(min(wake - now, POLL_INTERVAL_S))
                    if links.closing:
                        return
                    now = links.clock()
                while self._heap and self._heap[0].deliver_at <= now:
                    item = heapq.heappop(self._heap)
                    self._pending.setdefault(item.peer_id, deque()).append(item)
            self._flush_pending(now)
            if now >= next_heartbeat:
                self._queue_heartbeats(now)
                next_heartbeat = now + self.heartbeat_interval

    def _flush_pending(self, now: float) -> None:
        """Hand due messages to their sockets in order; keep a peer's backlog if its socket is full."""
        for pid, backlog in self._pending.items():
            while backlog:
                item = backlog[0]
                peer = self.links.get(pid)
                if peer is None or peer.generation != item.generation:
                    backlog.popleft()
                    self._dequeued(pid)
                    self._drop(item, "the peer was disconnected or replaced before delivery")
                    continue
                try:
                    with self.links.sock_lock:
                        if peer.socket.closed:
                            continue  # replaced concurrently; the next pass drops it by generation
                        peer.socket.send_multipart(item.frames, flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    if now - item.deliver_at > self.send_timeout:
                        backlog.popleft()
                        self._dequeued(pid)
                        self._drop(item, f"not accepted within {self.send_timeout:.1f} s (peer down or full)")
                        continue
                    break
                except zmq.ZMQError as exc:
                    backlog.popleft()
                    self._dequeued(pid)
                    self._drop(item, f"zmq error {exc}")
                    continue
                backlog.popleft()
                self._dequeued(pid)
                self.stats.count("sent", item.mtype, item.size)
        for pid in [pid for pid, backlog in self._pending.items() if not backlog]:
            del self._pending[pid]  # departed peers leave no empty queues behind
