"""The transport's shared state: the peer/socket table and the counters (checkfree.swarm.wire.transport).

:class:`Links` is the one object the transport's threads share: the PUSH socket per peer, each peer's
generation (a replaced peer gets a new one, so messages queued for its old process are recognized), the
``closing`` flag, and the condition that guards them (the sender's heap is guarded by it too, so a send
from the caller's thread and the sender thread keep each peer's order). :class:`Stats` counts bytes and
messages per type and the dropped messages, and records when each peer was last heard from.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from checkfree.swarm.wire.auth import Identity
from checkfree.swarm.wire.protocol import MessageType

log = logging.getLogger(__name__)


class TransportError(RuntimeError):
    """Misuse of a transport: unknown peer, closed transport, bad argument."""


def set_keepalive(sock: zmq.Socket) -> None:
    """TCP keepalive on ``sock``: a peer whose machine vanished is noticed by the kernel too."""
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)


@dataclass
class Peer:
    """One connected peer: its address, this process's PUSH socket to it, and its generation."""

    address: str
    socket: zmq.Socket
    generation: int
    connected_at: float
    left: bool = False


class Links:
    """The peer/socket table of one transport.

    Args:
        ctx: the transport's ZeroMQ context. node_id: this node's id (for log lines).
        identity: CURVE keypair and keyring (``None``: plain TCP). send_hwm: PUSH high-water mark, messages.
        clock: monotonic clock, seconds.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        node_id: int,
        identity: Identity | None,
        send_hwm: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx, self.node_id, self.identity, self.send_hwm, self.clock = (
            ctx,
            node_id,
            identity,
            send_hwm,
            clock,
        )
        self.cond = threading.Condition()
        """Guards ``peers``, ``closing`` and the sender's queues."""
        self.sock_lock = threading.Lock()
        """Serializes use of the PUSH sockets across threads."""
        self.peers: dict[int, Peer] = {}
        self.closing = False
        self._generations = itertools.count(1)

    def check_open(self) -> None:
        """Raises TransportError once the transport is closing."""
        if self.closing:
            raise TransportError(f"Transport of node {self.node_id} is closed.")

    def dial(self, peer_id: int, address: str) -> tuple[Peer, Peer | None]:
        """Open a PUSH socket to ``address`` for ``peer_id`` and put it in the table; returns the new peer and
        the one it replaced (whose socket the caller closes with :meth:`close_socket`).

        Raises:
            TransportError: the address is not ``tcp://HOST:PORT`` or libzmq refuses it (nothing is kept), the
                peer's public key is not in the keyring (authenticated transports), or the transport is closed.
        """
        if not isinstance(address, str) or not address.startswith("tcp://"):
            raise TransportError(f"Peer address is {address!r}; expected 'tcp://HOST:PORT'.")
        server_key = None
        if self.identity is not None:
            server_key = self.identity.keyring.key_of(peer_id)
            if server_key is None:
                raise TransportError(f"Peer {peer_id} has no admitted public key; it cannot be dialled.")
        sock = self.ctx.socket(zmq.PUSH)
        if server_key is not None and self.identity is not None:
            self.identity.make_client(sock, server_key)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.send_hwm)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        set_keepalive(sock)
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise TransportError(f"Peer address {address[:80]!r} cannot be dialled: {exc}.") from None
        with self.cond:
            if self.closing:
                sock.close(0)
            self.check_open()
            old = self.peers.get(peer_id)
            peer = self.peers[peer_id] = Peer(address, sock, next(self._generations), self.clock())
        return peer, old

    def remove(self, peer_id: int) -> Peer | None:
        """Take ``peer_id`` out of the table; the removed peer (close its socket) or None."""
        with self.cond:
            return self.peers.pop(peer_id, None)

    def get(self, peer_id: int) -> Peer | None:
        with self.cond:
            return self.peers.get(peer_id)

    def snapshot(self) -> dict[int, Peer]:
        with self.cond:
            return dict(self.peers)

    def mark_left(self, peer_id: int) -> None:
        """The peer sent LEAVE: it no longer counts as alive."""
        with self.cond:
            peer = self.peers.get(peer_id)
            if peer is not None:
                peer.left = True

    def close_socket(self, peer: Peer) -> None:
        with self.sock_lock:
            peer.socket.close(0)

    def close_all(self) -> None:
        """Close every PUSH socket (the threads have stopped)."""
        for peer in self.peers.values():
            peer.socket.close(0)
        self.peers.clear()


class Stats:
    """Byte and message counts per message type, dropped-message counts, and when each peer was last heard."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        per_type = {t.name: 0 for t in MessageType}
        self._counts: dict = {
            "sent_bytes": dict(per_type),
            "sent_messages": dict(per_type),
            "recv_bytes": dict(per_type),
            "recv_messages": dict(per_type),
            "dropped_malformed": 0,
            "dropped_spoofed": 0,
            "dropped_unsent": 0,
        }
        self._last_seen: dict[int, float] = {}

    def count(self, direction: str, mtype: MessageType, size: int) -> None:
        """One message of ``size`` bytes ``sent`` or ``recv``."""
        with self.lock:
            self._counts[f"{direction}_bytes"][mtype.name] += size
            self._counts[f"{direction}_messages"][mtype.name] += 1

    def drop(self, kind: str) -> None:
        """One message dropped: ``malformed``, ``spoofed`` or ``unsent``."""
        with self.lock:
            self._counts[f"dropped_{kind}"] += 1

    def heard(self, sender: int, now: float) -> None:
        with self.lock:
            self._last_seen[sender] = now

    def last_seen(self) -> dict[int, float]:
        with self.lock:
            return dict(self._last_seen)

    def snapshot(self) -> dict:
        with self.lock:
            return copy.deepcopy(self._counts)


def alive(peers: dict[int, Peer], last_seen: dict[int, float], now: float, peer_timeout: float) -> set[int]:
    """Peers that have not sent LEAVE and were connected or heard from within ``peer_timeout`` seconds."""
    return {
        pid
        for pid, p in peers.items()
        if not p.left and now - max(p.connected_at, last_seen.get(pid, -math.inf)) <= peer_timeout
    }
