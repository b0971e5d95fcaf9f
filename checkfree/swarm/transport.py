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

Threads: ``send`` (any thread) encodes, books the message on the emulated link and pushes it on a
delivery-time heap; one sender thread hands frames to the PUSH sockets when they are due, and sends a
HEARTBEAT to every connected peer every ``heartbeat_interval`` seconds; a message that is due at once with
nothing queued before it for that peer is handed to the socket by the calling thread instead. Whoever holds
the PULL socket (the application thread while it waits in ``recv``, else a receiver thread, once the
application has been away for ``HANDOFF_S``) validates every message (malformed ones are logged, counted and
dropped; the node keeps serving), records liveness and consumes heartbeats; the receiver thread queues the
rest for ``recv``. Saving these two thread hops per message halves the 8-byte round trip.

Back-pressure: PUSH high-water mark ``send_hwm`` messages per peer, PULL ``recv_hwm`` messages, inbox
``inbox_size`` messages. When a receiver's application stops calling ``recv``, its inbox fills, its
receiver thread stops reading, the PULL and then the sender's PUSH buffers fill, and the sender's PUSH
returns EAGAIN: the sender thread keeps that peer's messages in order and retries every 2 ms, dropping
(logged, counted in ``stats['dropped_unsent']``) any message not handed over within ``send_timeout``
seconds. ``send`` itself never blocks on the network.

Frames larger than ``max_message_bytes`` are refused by libzmq (``ZMQ_MAXMSGSIZE``), which closes that
connection; the sender's PUSH reconnects by itself. libzmq gives no per-message callback for this, so such
drops are not counted in ``stats``.

Authentication (``identity`` given, the swarm's default; checkfree.swarm.auth): the PULL socket is a CURVE
server behind a ZAP handler that admits only the keyring's keys, each PUSH socket a CURVE client of the
peer's key; a received message whose header ``sender`` is not the id bound to its authenticated key
(``User-Id``) is dropped and counted in ``stats['dropped_spoofed']``. ``validate`` (the swarm passes
checkfree.swarm.control.check) runs on every decoded message; a ``ProtocolError`` from it counts as malformed.
Every socket closes with linger 0 (also the context's default), so ``close`` never waits on the network.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import logging
import math
import queue
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from checkfree.swarm.auth import Identity
from checkfree.swarm.netem import NetEm
from checkfree.swarm.protocol import (
    DEFAULT_MAX_MESSAGE_BYTES,
    HEADER,
    Message,
    MessageType,
    ProtocolError,
    decode,
    encode,
    nbytes,
)
from checkfree.swarm.snapshots import SnapshotPool

log = logging.getLogger(__name__)

RETRY_INTERVAL_S = 0.002
"""Seconds between retries of a send that found the peer's buffer full or its connection down."""
POLL_INTERVAL_S = 0.05
"""Longest sleep of the background threads, seconds (bounds how long ``close`` waits)."""
HANDOFF_S = 0.02
"""The receiver thread reads the socket once the application has been out of ``recv`` this long, seconds."""


class TransportError(RuntimeError):
    """Misuse of a transport: unknown peer, closed transport, bad argument."""


@dataclass(order=True)
class _Outgoing:
    deliver_at: float
    seq: int
    peer_id: int = field(compare=False)
    generation: int = field(compare=False)
    mtype: MessageType = field(compare=False)
    frames: list = field(compare=False)
    size: int = field(compare=False)


@dataclass
class _Peer:
    address: str
    socket: zmq.Socket
    generation: int
    connected_at: float
    left: bool = False


def _empty_stats() -> dict:
    per_type = {t.name: 0 for t in MessageType}
    return {
        "sent_bytes": dict(per_type),
        "sent_messages": dict(per_type),
        "recv_bytes": dict(per_type),
        "recv_messages": dict(per_type),
        "dropped_malformed": 0,
        "dropped_spoofed": 0,
        "dropped_unsent": 0,
    }


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
        self.netem = netem
        self.heartbeat_interval = heartbeat_interval
        self.peer_timeout = peer_timeout
        self.max_message_bytes = max_message_bytes
        self.send_hwm = send_hwm
        self.send_timeout = send_timeout
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
        self._set_keepalive(self._pull)
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

        self._cond = threading.Condition()  # guards _heap, _peers, _closing
        self._heap: list[_Outgoing] = []
        self._seq = itertools.count()
        self._peers: dict[int, _Peer] = {}
        self._generations = itertools.count(1)
        self._closing = False
        self._sock_lock = threading.Lock()  # serializes use of the PUSH sockets across threads
        self._stats_lock = threading.Lock()
        self._stats = _empty_stats()
        self._last_seen: dict[int, float] = {}
        self._inbox: queue.Queue[Message] = queue.Queue(maxsize=inbox_size)
        self._pull_lock = threading.Lock()  # whoever holds it may read the PULL socket
        self._app_reading = False  # the application is inside recv() and reads the socket itself
        self._app_left_at = -math.inf
        self._bg_event = threading.Event()
        self._wake_in = self._ctx.socket(zmq.PAIR)  # the receiver thread polls it: "give me the socket"
        self._wake_in.bind(f"inproc://wake-{node_id}-{id(self)}")
        self._wake_out = self._ctx.socket(zmq.PAIR)  # used by the thread inside recv()
        self._wake_out.connect(f"inproc://wake-{node_id}-{id(self)}")
        self._pending: dict[int, deque[_Outgoing]] = {}
        self._queued: dict[int, int] = {}  # per peer: messages on the heap or in _pending (guarded by _cond)
        self._sender = threading.Thread(target=self._send_loop, name=f"transport-{node_id}-send", daemon=True)
        self._receiver = threading.Thread(
            target=self._recv_loop, name=f"transport-{node_id}-recv", daemon=True
        )
        self._sender.start()
        self._receiver.start()

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
        if not isinstance(address, str) or not address.startswith("tcp://"):
            raise TransportError(f"Peer address is {address!r}; expected 'tcp://HOST:PORT'.")
        server_key = None
        if self.identity is not None:
            server_key = self.identity.keyring.key_of(peer_id)
            if server_key is None:
                raise TransportError(f"Peer {peer_id} has no admitted public key; it cannot be dialled.")
        sock = self._ctx.socket(zmq.PUSH)
        if server_key is not None and self.identity is not None:
            self.identity.make_client(sock, server_key)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.send_hwm)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        self._set_keepalive(sock)
        try:
            sock.connect(address)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise TransportError(f"Peer address {address[:80]!r} cannot be dialled: {exc}.") from None
        with self._cond:
            self._check_open()
            old = self._peers.get(peer_id)
            self._peers[peer_id] = _Peer(address, sock, next(self._generations), self._clock())
        if old is not None:
            with self._sock_lock:
                old.socket.close(0)
            if self.netem is not None:
                self.netem.forget(peer_id)
            log.info("node %d: peer %d replaced (%s -> %s)", self.node_id, peer_id, old.address, address)

    def disconnect(self, peer_id: int) -> None:
        """Forget a peer (no-op if unknown); messages still queued for it are dropped."""
        with self._cond:
            old = self._peers.pop(peer_id, None)
        if old is not None:
            with self._sock_lock:
                old.socket.close(0)

    def send(self, peer_id: int, msg: Message) -> int:
        """Queue ``msg`` for ``peer_id``; returns its size in bytes. Never blocks on the network.

        The tensors are copied now (into reused buffers: checkfree.swarm.snapshots), so the caller may
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
        with self._cond:
            self._check_open()
            peer = self._peers.get(peer_id)
            if peer is None:
                raise TransportError(
                    f"Peer {peer_id} is not connected; call connect(peer_id, address) first."
                )
            now = self._clock()
            deliver_at = self.netem.reserve(self.node_id, peer_id, size, now) if self.netem else now
            item = _Outgoing(deliver_at, next(self._seq), peer_id, peer.generation, msg.type, frames, size)
            if deliver_at <= now and not self._queued.get(peer_id) and self._send_now(peer, item):
                return size  # due now and nothing ahead of it: no hop through the sender thread
            heapq.heappush(self._heap, item)
            self._queued[peer_id] = self._queued.get(peer_id, 0) + 1
            self._cond.notify()
        return size

    def recv(self, timeout: float) -> Message | None:
        """Next valid message (heartbeats excluded), or ``None`` after ``timeout`` seconds.

        Call it from one thread at a time. While the application waits here it reads the PULL socket itself
        (no hop through the receiver thread, which costs a thread wake-up per message); the receiver thread
        takes the socket over when the application has been out of ``recv`` for ``HANDOFF_S`` seconds (it
        is computing), so heartbeats are still consumed and liveness stays current.
        """
        if not math.isfinite(timeout) or timeout < 0:
            raise TransportError(f"recv timeout is {timeout!r}; expected a finite number of seconds >= 0.")
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            pass
        deadline = self._clock() + timeout
        self._app_reading = True
        try:
            if not self._pull_lock.acquire(blocking=False):
                try:
                    self._wake_out.send(b"", flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is pending already
                if not self._pull_lock.acquire(timeout=max(timeout, POLL_INTERVAL_S)):
                    return None
            try:
                return self._read(deadline)
            finally:
                self._pull_lock.release()
        finally:
            self._app_left_at = self._clock()
            self._app_reading = False

    def _read(self, deadline: float) -> Message | None:
        """The caller holds ``_pull_lock``: queued messages first, then the socket until ``deadline``."""
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            pass
        while not self._closing:
            wait = min(max(0.0, deadline - self._clock()), POLL_INTERVAL_S)
            if self._pull.poll(wait * 1000, zmq.POLLIN):
                try:
                    frames = self._pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue
                msg = self._accept(frames)
                if msg is not None:
                    return msg
            elif self._clock() >= deadline:
                return None
        return None

    def alive_peers(self) -> set[int]:
        """Connected peers heard from (any valid message) within ``peer_timeout`` seconds."""
        now = self._clock()
        with self._cond:
            peers = dict(self._peers)
        with self._stats_lock:
            seen = dict(self._last_seen)
        return {
            pid
            for pid, p in peers.items()
            if not p.left and now - max(p.connected_at, seen.get(pid, -math.inf)) <= self.peer_timeout
        }

    def dead_peers(self) -> set[int]:
        """Connected peers silent for more than ``peer_timeout`` seconds, or that sent LEAVE."""
        with self._cond:
            peers = set(self._peers)
        return peers - self.alive_peers()

    @property
    def stats(self) -> dict:
        """Snapshot: ``sent_bytes``/``sent_messages``/``recv_bytes``/``recv_messages`` per MessageType
        name (bytes = all frames), ``dropped_malformed`` and ``dropped_unsent`` counts."""
        with self._stats_lock:
            return copy.deepcopy(self._stats)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the threads (each joined within ``timeout`` seconds) and close every socket (linger 0)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        for thread in (self._sender, self._receiver):
            thread.join(timeout)
        stuck = [t.name for t in (self._sender, self._receiver) if t.is_alive()]
        if stuck or not self._pull_lock.acquire(timeout=timeout):
            log.warning("node %d: threads %s did not stop within %.1f s", self.node_id, stuck, timeout)
            return  # closing sockets under a live thread is unsafe; the daemon threads die with the process
        self._wake_in.close(0)
        self._wake_out.close(0)
        for peer in self._peers.values():
            peer.socket.close(0)
        self._peers.clear()
        self._pull.close(0)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _set_keepalive(sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 10)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)

    def _check_open(self) -> None:
        if self._closing:
            raise TransportError(f"Transport of node {self.node_id} is closed.")

    def _count(self, direction: str, mtype: MessageType, size: int) -> None:
        with self._stats_lock:
            self._stats[f"{direction}_bytes"][mtype.name] += size
            self._stats[f"{direction}_messages"][mtype.name] += 1

    def _drop_unsent(self, item: _Outgoing, reason: str) -> None:
        with self._stats_lock:
            self._stats["dropped_unsent"] += 1
        log.warning(
            "node %d: dropped a %s message to peer %d: %s",
            self.node_id,
            item.mtype.name,
            item.peer_id,
            reason,
        )

    def _send_now(self, peer: _Peer, item: _Outgoing) -> bool:
        """Hand ``item`` to its socket from the caller's thread (``_cond`` held, so the per-peer order is
        kept); False if the socket would block (the caller queues it for the sender thread)."""
        try:
            with self._sock_lock:
                peer.socket.send_multipart(item.frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            self._drop_unsent(item, f"zmq error {exc}")
            return True
        self._count("sent", item.mtype, item.size)
        return True

    def _dequeued(self, peer_id: int) -> None:
        with self._cond:
            left = self._queued.get(peer_id, 0) - 1
            if left > 0:
                self._queued[peer_id] = left
            else:
                self._queued.pop(peer_id, None)

    def _queue_heartbeats(self, now: float) -> None:
        hb = encode(Message(MessageType.HEARTBEAT, self.node_id))
        size = nbytes(hb)
        with self._cond:
            for pid, peer in self._peers.items():
                at = self.netem.latency_only(self.node_id, pid, now) if self.netem else now
                heapq.heappush(
                    self._heap,
                    _Outgoing(at, next(self._seq), pid, peer.generation, MessageType.HEARTBEAT, hb, size),
                )
                self._queued[pid] = self._queued.get(pid, 0) + 1

    def _send_loop(self) -> None:
        next_heartbeat = self._clock()
        while True:
            with self._cond:
                if self._closing:
                    return
                now = self._clock()
                wake = min(next_heartbeat, self._heap[0].deliver_at if self._heap else math.inf)
                if any(self._pending.values()):
                    wake = min(wake, now + RETRY_INTERVAL_S)
                if wake > now:
                    self._cond.wait(min(wake - now, POLL_INTERVAL_S))
                    if self._closing:
                        return
                    now = self._clock()
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
                with self._cond:
                    peer = self._peers.get(pid)
                if peer is None or peer.generation != item.generation:
                    backlog.popleft()
                    self._dequeued(pid)
                    self._drop_unsent(item, "the peer was disconnected or replaced before delivery")
                    continue
                try:
                    with self._sock_lock:
                        if peer.socket.closed:
                            continue  # replaced concurrently; the next pass drops it by generation
                        peer.socket.send_multipart(item.frames, flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    if now - item.deliver_at > self.send_timeout:
                        backlog.popleft()
                        self._dequeued(pid)
                        self._drop_unsent(
                            item, f"not accepted within {self.send_timeout:.1f} s (peer down or full)"
                        )
                        continue
                    break
                except zmq.ZMQError as exc:
                    backlog.popleft()
                    self._dequeued(pid)
                    self._drop_unsent(item, f"zmq error {exc}")
                    continue
                backlog.popleft()
                self._dequeued(pid)
                self._count("sent", item.mtype, item.size)
        for pid in [pid for pid, backlog in self._pending.items() if not backlog]:
            del self._pending[pid]  # departed peers leave no empty queues behind

    def _recv_loop(self) -> None:
        """Read the PULL socket while the application is not in ``recv`` (see there)."""
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._wake_in, zmq.POLLIN)
        while not self._closing:
            if self._app_reading or self._clock() - self._app_left_at < HANDOFF_S:
                self._bg_event.wait(HANDOFF_S)
                continue
            if self._inbox.full():  # the application is not calling recv: stop reading (back-pressure)
                self._bg_event.wait(RETRY_INTERVAL_S)
                continue
            with self._pull_lock:
                events = dict(poller.poll(POLL_INTERVAL_S * 1000))
                if self._wake_in in events:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                    continue
                while not self._closing and not self._app_reading and not self._inbox.full():
                    try:
                        frames = self._pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    msg = self._accept(frames)
                    if msg is not None:
                        self._inbox.put_nowait(msg)  # the only producer, and not full: never blocks

    def _accept(self, frames: list[zmq.Frame]) -> Message | None:
        """Decode and check one received message; the message for the application, or None (dropped,
        or a heartbeat)."""
        try:
            msg = decode(frames, self.max_message_bytes, zero_copy=True)
        except ProtocolError as exc:
            with self._stats_lock:
                self._stats["dropped_malformed"] += 1
            log.warning(
                "node %d: dropped a malformed message from %s: %s", self.node_id, self._describe(frames), exc
            )
            return None
        if self.identity is not None:
            owner = self.identity.keyring.owner(frames[0].get("User-Id"))
            if owner != msg.sender:
                with self._stats_lock:
                    self._stats["dropped_spoofed"] += 1
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
                with self._stats_lock:
                    self._stats["dropped_malformed"] += 1
                log.warning("node %d: dropped a %s from %d: %s", self.node_id, msg.type.name, msg.sender, exc)
                return None
        self._count("recv", msg.type, nbytes(frames))
        with self._stats_lock:
            self._last_seen[msg.sender] = self._clock()
        if msg.type == MessageType.HEARTBEAT:
            return None
        if msg.type == MessageType.LEAVE:
            with self._cond:
                peer = self._peers.get(msg.sender)
                if peer is not None:
                    peer.left = True
        return msg

    @staticmethod
    def _describe(frames: list[zmq.Frame]) -> str:
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
