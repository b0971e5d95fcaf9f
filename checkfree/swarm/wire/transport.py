"""Peer links between swarm nodes over ZeroMQ: pickle-free messages, WAN emulation, heartbeats, rejoins.

Shape: each node binds one PULL socket (its inbox address) and opens one PUSH socket per peer, connected to
that peer's address. Data flows one way per socket; a reply travels on the replier's own PUSH socket, so
each direction of a link goes through the sender's netem. PUSH/PULL was chosen over ROUTER/DEALER because
nothing is ever answered on the same connection (ROUTER's identity frame would buy nothing), and because
PUSH with ``ZMQ_IMMEDIATE=1`` refuses (EAGAIN) to queue for a peer that has no live connection: a message
to a dead peer waits in this process, where it can be retried against the rejoined peer or dropped at its
deadline, instead of sitting in a dead pipe. ``connect(peer, address)`` on a known peer replaces its
socket (a peer that died and rejoined, at the same or a new address): messages still queued for the old
process are dropped and counted, and the new socket connects fresh.

Parts (each a small object with its state passed in): the peer/socket table and the counters
(checkfree.swarm.wire.transport: ``Links``, ``Stats``), the send side (checkfree.swarm.wire.sender:
``send`` from any thread snapshots the tensors (checkfree.swarm.wire.send_buffers), books the message on the
emulated link and hands it to the PUSH socket at once when it is due and nothing is queued before it, else a
sender thread does at its delivery time; heartbeats every ``heartbeat_interval`` seconds), and the receive
side (checkfree.swarm.wire.receiver: whoever holds the PULL socket, the application inside ``recv`` or
a receiver thread, validates every message, records liveness and consumes heartbeats).

Back-pressure: PUSH high-water mark ``send_hwm`` messages per peer, PULL ``recv_hwm`` messages, inbox
``inbox_size`` messages. When a receiver's application stops calling ``recv``, its inbox fills, its
receiver thread stops reading, the PULL and then the sender's PUSH buffers fill, and the sender's PUSH
returns EAGAIN: the sender thread keeps that peer's messages in order and retries every 2 ms, dropping
(logged, counted in ``stats['dropped_unsent']``) any message not handed over within ``send_timeout``
seconds. ``send`` itself never blocks on the network.

Frames larger than ``max_message_bytes`` are refused by libzmq (``ZMQ_MAXMSGSIZE``), which closes that
connection; the sender's PUSH reconnects by itself. libzmq gives no per-message callback for this, so such
drops are not counted in ``stats``.

Authentication (``identity`` given, the swarm's default; checkfree.swarm.wire.auth): the PULL socket is a CURVE
server behind a ZAP handler that admits only the keyring's keys, each PUSH socket a CURVE client of the
peer's key; a received message whose header ``sender`` is not the id bound to its authenticated key
(``User-Id``) is dropped and counted in ``stats['dropped_spoofed']``. ``validate`` (the swarm passes
checkfree.swarm.wire.control.check) runs on every decoded message; a ``ProtocolError`` from it counts as malformed.
Every socket closes with linger 0 (also the context's default), so ``close`` never waits on the network.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import zmq

from checkfree.swarm.wire.auth import Identity
from checkfree.swarm.wire.links import Links, Stats, TransportError, alive, set_keepalive
from checkfree.swarm.wire.netem import NetEm
from checkfree.swarm.wire.protocol import DEFAULT_MAX_MESSAGE_BYTES, Message, encode, nbytes
from checkfree.swarm.wire.receiver import Receiver
from checkfree.swarm.wire.send_buffers import SnapshotPool
from checkfree.swarm.wire.sender import Sender

log = logging.getLogger(__name__)


class Transport:
    """One node's links to its peers.

    Args:
        node_id: this node's id (the ``sender`` of every message it sends).
        bind_host: interface to listen on.
        port: TCP port to listen on; 0 picks a free one (see ``address``).
        netem: WAN emulation applied to every send (must use a real monotonic clock); ``None`` = none.
        heartbeat_interval: seconds between heartbeats to each connected peer.
        peer_timeout: a connected peer silent for this many seconds is dead.
        max_message_bytes: largest message sent or accepted, bytes (also libzmq's per-frame limit).
        send_hwm, recv_hwm: ZeroMQ high-water marks, messages.
        send_timeout: seconds a due message may wait for a full or disconnected peer before it is dropped.
        inbox_size: received messages buffered for ``recv``.
        identity: this process's CURVE keypair and the keyring it admits; ``None`` = plain TCP, no
            authentication (single-machine debugging only: anyone who reaches the port can send anything).
        validate: called on every decoded message; raises ``ProtocolError`` to drop it as malformed.

    Raises:
        TransportError: on an invalid argument; ``zmq.ZMQError`` if the address cannot be bound.
    """

    def __init__(
        self,
        node_id: int,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        netem: NetEm | None = None,
        heartbeat_interval: float = 0.5,
        peer_timeout: float = 3.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        send_hwm: int = 1000,
        recv_hwm: int = 1000,
        send_timeout: float = 30.0,
        inbox_size: int = 10000,
        identity: Identity | None = None,
        validate: Callable[[Message], None] | None = None,
    ) -> None:
        for name, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("peer_timeout", peer_timeout),
            ("send_timeout", send_timeout),
        ):
            if not math.isfinite(value) or value <= 0:
                raise TransportError(f"{name} is {value!r} s; expected a finite number of seconds > 0.")
        self.node_id = node_id
        self.peer_timeout = peer_timeout
        self.max_message_bytes = max_message_bytes
        self.send_hwm = send_hwm
        self._clock = time.monotonic
        self._snapshots = SnapshotPool()
        self.identity = identity
        self.validate = validate
        self._ctx = zmq.Context(io_threads=1)
        self._ctx.setsockopt(zmq.LINGER, 0)
        self._auth = identity.start_authenticator(self._ctx) if identity is not None else None
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            identity.make_server(self._pull)
        self._pull.setsockopt(zmq.RCVHWM, recv_hwm)
        self._pull.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        set_keepalive(self._pull)
        try:
            self._pull.bind(f"tcp://{bind_host}:{port if port else '*'}")
        except zmq.ZMQError:
            self._pull.close(0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()
            raise
        self.address: str = self._pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        """The bound address, ``tcp://HOST:PORT``."""
        self._links = Links(self._ctx, node_id, identity, send_hwm, self._clock)
        self._stats = Stats()
        self._sender = Sender(self._links, self._stats, netem, heartbeat_interval, send_timeout)
        self._receiver = Receiver(
            self._pull, self._links, self._stats, identity, validate, max_message_bytes, inbox_size
        )
        self._sender.thread.start()
        self._receiver.thread.start()

    # ---------------------------------------------------------------- settings the sender thread reads

    @property
    def netem(self) -> NetEm | None:
        """The WAN emulation every send goes through; settable (a node applies its WELCOME's locations)."""
        return self._sender.netem

    @netem.setter
    def netem(self, value: NetEm | None) -> None:
        self._sender.netem = value

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between the HEARTBEATs queued for every connected peer; settable."""
        return self._sender.heartbeat_interval

    @heartbeat_interval.setter
    def heartbeat_interval(self, value: float) -> None:
        self._sender.heartbeat_interval = value

    @property
    def send_timeout(self) -> float:
        """Seconds after its delivery time within which a message must be accepted, else it is dropped."""
        return self._sender.send_timeout

    @send_timeout.setter
    def send_timeout(self, value: float) -> None:
        self._sender.send_timeout = value

    # ---------------------------------------------------------------- public API

    def connect(self, peer_id: int, address: str) -> None:
        """Add a peer, or replace it (a peer that rejoined, at the same or a new address).

        Replacing closes the old socket: messages still queued for the old process are dropped and counted
        in ``stats['dropped_unsent']``; emulated links to the peer restart idle. The peer counts as alive
        for ``peer_timeout`` seconds from now even before its first heartbeat.

        Raises:
            TransportError: the address is not ``tcp://HOST:PORT`` or libzmq refuses it (nothing is kept), or
                the peer's public key is not in the keyring (authenticated transports).
        """
        _, old = self._links.dial(peer_id, address)
        if old is not None:
            self._links.close_socket(old)
            if self.netem is not None:
                self.netem.forget(peer_id)
            log.info("node %d: peer %d replaced (%s -> %s)", self.node_id, peer_id, old.address, address)

    def disconnect(self, peer_id: int) -> None:
        """Forget a peer (no-op if unknown); messages still queued for it are dropped."""
        old = self._links.remove(peer_id)
        if old is not None:
            self._links.close_socket(old)

    def send(self, peer_id: int, msg: Message) -> int:
        """Queue ``msg`` for ``peer_id``; returns its size in bytes. Never blocks on the network.

        The tensors are copied now (into reused buffers: checkfree.swarm.wire.send_buffers), so the caller may
        modify them right away. The message is handed to the socket at its emulated delivery time (netem,
        FIFO per link); one due at once with nothing queued before it goes from the calling thread.

        Raises:
            ProtocolError: if ``msg`` is not a valid message or is larger than ``max_message_bytes``.
            TransportError: if ``peer_id`` is not connected, ``msg.sender`` is not this node, or the
                transport is closed.
        """
        if msg.sender != self.node_id:
            raise TransportError(f"Message sender is {msg.sender}; expected this node's id {self.node_id}.")
        frames = encode(msg, self.max_message_bytes, copy=True, snapshot=self._snapshots.snapshot)
        size = nbytes(frames)
        self._sender.submit(peer_id, msg.type, frames, size)
        return size

    def recv(self, timeout: float) -> Message | None:
        """Next valid message (heartbeats excluded), or ``None`` after ``timeout`` seconds.

        Call it from one thread at a time. While the application waits here it reads the PULL socket itself
        (no hop through the receiver thread, which costs a thread wake-up per message); the receiver thread
        takes the socket over when the application has been out of ``recv`` for ``HANDOFF_S`` seconds (it
        is computing), so heartbeats are still consumed and liveness stays current.

        Raises:
            TransportError: ``timeout`` is not a finite number of seconds >= 0.
        """
        return self._receiver.recv(timeout)

    def alive_peers(self) -> set[int]:
        """Connected peers heard from (any valid message) within ``peer_timeout`` seconds."""
        now = self._clock()
        return alive(self._links.snapshot(), self._stats.last_seen(), now, self.peer_timeout)

    def dead_peers(self) -> set[int]:
        """Connected peers silent for more than ``peer_timeout`` seconds, or that sent LEAVE."""
        return set(self._links.snapshot()) - self.alive_peers()

    @property
    def stats(self) -> dict:
        """Snapshot: ``sent_bytes``/``sent_messages``/``recv_bytes``/``recv_messages`` per MessageType
        name (bytes = all frames), ``dropped_malformed``, ``dropped_spoofed`` and ``dropped_unsent`` counts."""
        return self._stats.snapshot()

    def close(self, timeout: float = 2.0) -> None:
        """Stop the threads (each joined within ``timeout`` seconds) and close every socket (linger 0)."""
        with self._links.cond:
            if self._links.closing:
                return
            self._links.closing = True
            self._links.cond.notify_all()
        threads = (self._sender.thread, self._receiver.thread)
        for thread in threads:
            thread.join(timeout)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck or not self._receiver.pull_lock.acquire(timeout=timeout):
            log.warning("node %d: threads %s did not stop within %.1f s", self.node_id, stuck, timeout)
            return  # closing sockets under a live thread is unsafe; the daemon threads die with the process
        self._receiver.close_sockets()
        self._links.close_all()
        self._pull.close(0)
        if self._auth is not None:
            self._auth.stop()
        if self.identity is not None:
            self.identity.keyring.refusals.flush()  # the ZAP thread has stopped
        self._ctx.term()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
