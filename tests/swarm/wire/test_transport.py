"""Live transports on 127.0.0.1: delivery, garbage resistance, emulated WAN timing, liveness and rejoins."""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Iterator

import pytest
import torch
import zmq

from checkfree.swarm.topology import parse_locations
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.netem import NetEm
from checkfree.swarm.wire.protocol import HEADER, MAGIC, VERSION, Message, MessageType, ProtocolError, encode
from checkfree.swarm.wire.transport import Transport

MB = 1_000_000


def _fwd(sender: int, mb: int = 0, n: int = 4) -> Message:
    return Message(
        MessageType.FORWARD,
        sender,
        1,
        mb,
        {"stage": 0},
        {"activations": torch.arange(n, dtype=torch.float32)},
    )


def _recv_type(t: Transport, mtype: MessageType, timeout: float = 5.0) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = t.recv(timeout=max(0.0, deadline - time.monotonic()))
        if msg is not None and msg.type == mtype:
            return msg
    raise AssertionError(f"no {mtype.name} within {timeout} s")


def _wait_for(predicate, timeout: float = 3.0) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass (stats are updated by background threads)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def pair() -> Iterator[tuple[Transport, Transport]]:
    a, b = (
        Transport(0, heartbeat_interval=0.05, peer_timeout=0.5),
        Transport(1, heartbeat_interval=0.05, peer_timeout=0.5),
    )
    a.connect(1, b.address)
    b.connect(0, a.address)
    yield a, b
    a.close()
    b.close()


@pytest.mark.timeout(20)
def test_request_response_and_stats(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    assert a.address.startswith("tcp://127.0.0.1:") and not a.address.endswith(":0")
    size = a.send(1, _fwd(0, n=1000))
    got = _recv_type(b, MessageType.FORWARD)
    assert torch.equal(got.tensors["activations"], torch.arange(1000, dtype=torch.float32))
    b.send(
        0, Message(MessageType.BACKWARD, 1, 1, 0, {"stage": 1}, {"gradients": -got.tensors["activations"]})
    )
    back = _recv_type(a, MessageType.BACKWARD)
    assert back.tensors["gradients"][5] == -5.0
    # the sender thread counts a message once libzmq has taken it, which may trail the round trip
    assert _wait_for(lambda: a.stats["sent_bytes"]["FORWARD"] == size)
    assert b.stats["recv_bytes"]["FORWARD"] == size
    assert a.stats["sent_messages"]["FORWARD"] == 1 and b.stats["recv_messages"]["BACKWARD"] == 0
    assert _wait_for(lambda: a.stats["recv_messages"]["HEARTBEAT"] >= 1)
    assert a.alive_peers() == {1} and a.dead_peers() == set()


@pytest.mark.timeout(20)
def test_send_copies_tensors_and_preserves_per_peer_order(pair: tuple[Transport, Transport]) -> None:
    a, b = pair
    t = torch.zeros(100)
    for mb in range(50):
        t.fill_(mb)
        a.send(1, Message(MessageType.FORWARD, 0, 1, mb, {"stage": 0}, {"activations": t}))
    got = [_recv_type(b, MessageType.FORWARD) for _ in range(50)]
    assert [m.microbatch for m in got] == list(range(50))
    assert all(m.tensors["activations"][0].item() == m.microbatch for m in got)


@pytest.mark.timeout(10)
def test_send_misuse_raises_clear_errors(pair: tuple[Transport, Transport]) -> None:
    a, _ = pair
    with pytest.raises(TransportError, match="Peer 9 is not connected"):
        a.send(9, _fwd(0))
    with pytest.raises(TransportError, match="sender is 5"):
        a.send(1, _fwd(5))
    with pytest.raises(TransportError, match="tcp://"):
        a.connect(2, "127.0.0.1:5")
    with pytest.raises(TransportError, match="recv timeout"):
        a.recv(float("inf"))


def _garbage() -> dict[str, list[bytes]]:
    good = [bytes(f) for f in encode(_fwd(7))]
    return {
        "pickle payload": [pickle.dumps({"evil": 1})],
        "pickle frames": [pickle.dumps(good)] * 4,
        "truncated frame": [good[0][:17]] + good[1:],
        "length 2**63": good[:2] + [good[2][:-8] + (2**63).to_bytes(8, "little")] + good[3:],
        "wrong dtype": good[:2] + [bytes([200]) + good[2][1:]] + good[3:],
        "wrong shape": good[:2]
        + [good[2][:-16] + (5).to_bytes(8, "little", signed=True) + good[2][-8:]]
        + good[3:],
        "unknown type": [HEADER.pack(MAGIC, VERSION, 77, 0, 7, 1, 0, len(good[1]), 1)] + good[1:],
        "random bytes": [bytes(range(256)) * 3, b"\x00\xff" * 7],
        "empty frame": [b""],
    }


@pytest.mark.timeout(30)
def test_garbage_is_dropped_logged_counted_and_the_node_keeps_serving(
    pair: tuple[Transport, Transport], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = pair
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(b.address)
    try:
        cases = _garbage()
        with caplog.at_level(logging.WARNING, logger="checkfree.swarm.wire"):
            for i, frames in enumerate(cases.values()):
                raw.send_multipart(frames)
                raw.send_multipart([bytes(f) for f in encode(_fwd(7, mb=i))])  # a valid one right behind
                assert _recv_type(b, MessageType.FORWARD).microbatch == i
        assert b.stats["dropped_malformed"] == len(cases)
        assert sum("malformed message from 127.0.0.1" in r.getMessage() for r in caplog.records) == len(cases)
        # request/response between the real peers still works
        a.send(1, _fwd(0, mb=99))
        got = _recv_type(b, MessageType.FORWARD)
        assert got.sender == 0 and got.microbatch == 99
        b.send(0, Message(MessageType.BACKWARD, 1, 1, 99, {"stage": 1}, {"gradients": torch.ones(2)}))
        assert _recv_type(a, MessageType.BACKWARD).microbatch == 99
    finally:
        raw.close(0)


@pytest.mark.timeout(30)
def test_oversized_frames_are_refused_and_the_node_keeps_serving() -> None:
    small = Transport(1, max_message_bytes=MB)
    a, c = Transport(0), Transport(2)
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        a.connect(1, small.address)
        c.connect(1, small.address)
        raw.connect(small.address)
        raw.send_multipart([b"\0" * (4 * MB)])  # libzmq closes a connection that sends a frame > MAXMSGSIZE
        a.send(1, _fwd(0, n=MB))  # 4 MB: valid, but over the receiver's limit
        c.send(1, _fwd(2, mb=3))
        assert _recv_type(small, MessageType.FORWARD).sender == 2
        # the offending sender's socket reconnects by itself and later messages get through
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            a.send(1, _fwd(0, mb=5))
            got = small.recv(timeout=0.2)
            if got is not None and got.sender == 0:
                break
        else:
            raise AssertionError("sender of an oversized message never got through again")
        with pytest.raises(ProtocolError, match="at most 1000000 bytes"):
            small.send(1, _fwd(1, n=MB))  # a transport refuses to send beyond its own limit
    finally:
        raw.close(0)
        for t in (a, c, small):
            t.close()


def _table(latency_ms: float, bandwidth_bytes_per_s: float):
    return parse_locations(
        {
            "default": {"latency_ms": 10, "bandwidth_gib_s": 0.5},
            "default_geo": ["A", "B"],
            "links": [
                {
                    "a": "A",
                    "b": "B",
                    "latency_ms": latency_ms,
                    "bandwidth_gib_s": bandwidth_bytes_per_s / 2**30,
                }
            ],
        }
    )


@pytest.mark.timeout(20)
def test_receiver_sees_emulated_delay_with_fifo_queueing() -> None:
    # 100 ms latency, 4 MB/s: two concurrent 0.4 MB sends arrive at 0.2 s and 0.3 s (the model's times).
    net = NetEm(_table(100, 4 * MB), locations=["A", "B"])
    a, b = Transport(0, netem=net), Transport(1)
    try:
        a.connect(1, b.address)
        t0 = time.monotonic()
        link = net.link(0, 1)
        sizes = [a.send(1, _fwd(0, mb=i, n=100_000)) for i in range(2)]
        model = [
            link.spec.latency_s + sum(sizes[: i + 1]) / link.spec.bandwidth_bytes_per_s for i in range(2)
        ]
        arrived = []
        for _ in range(2):
            _recv_type(b, MessageType.FORWARD)
            arrived.append(time.monotonic() - t0)
        for got, want in zip(arrived, model, strict=True):
            assert want - 0.002 <= got <= want + 0.08, (arrived, model)
        # the reverse direction goes through the other side's netem (here none): immediate
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(20)
def test_a_netem_set_after_construction_delays_every_send() -> None:
    # A node learns its WAN locations from the WELCOME, after its transport exists (membership.configure_links):
    # the emulation set then must apply to the next send, not only one given to the constructor.
    a, b = Transport(0), Transport(1)
    try:
        a.connect(1, b.address)
        a.netem = NetEm(_table(300, 100 * MB), locations=["A", "B"])
        a.heartbeat_interval = 0.05
        assert a.netem is not None and a.heartbeat_interval == 0.05
        t0 = time.monotonic()
        a.send(1, _fwd(0))
        _recv_type(b, MessageType.FORWARD)
        assert time.monotonic() - t0 >= 0.29  # never earlier than the emulated 300 ms latency
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(20)
def test_dead_peer_detected_then_rejoin_under_new_identity_same_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = Transport(0, heartbeat_interval=0.05, peer_timeout=0.4, send_timeout=0.5)
    b = Transport(1, heartbeat_interval=0.05, peer_timeout=0.4)
    try:
        a.connect(1, b.address)
        b.connect(0, a.address)
        time.sleep(0.15)
        assert a.alive_peers() == {1}
        port = int(b.address.rsplit(":", 1)[1])
        b.close()
        t_dead = time.monotonic()
        while 1 not in a.dead_peers():
            assert time.monotonic() - t_dead < 2.0, "crashed peer never declared dead"
            time.sleep(0.02)
        assert 0.3 <= time.monotonic() - t_dead <= 1.0
        a.send(1, _fwd(0, mb=1))  # queued for the dead process
        # the replacement binds the same port (new process, new identity) and introduces itself
        b2 = Transport(21, port=port, heartbeat_interval=0.05, peer_timeout=0.4)
        try:
            b2.connect(0, a.address)
            t0 = time.monotonic()
            a.connect(1, b2.address)  # replacing drops what was queued for the old process
            a.send(1, _fwd(0, mb=2))
            got = _recv_type(b2, MessageType.FORWARD, timeout=3.0)
            rejoin_s = time.monotonic() - t0
            assert got.microbatch == 2 and rejoin_s < 1.0
            time.sleep(0.15)
            assert a.alive_peers() == {1}
        finally:
            b2.close()
    finally:
        a.close()


@pytest.mark.timeout(20)
def test_rejoin_at_new_address_and_leave() -> None:
    a, b = Transport(0, peer_timeout=5.0), Transport(1)
    try:
        a.connect(1, b.address)
        b.connect(0, a.address)
        b.close()
        c = Transport(1)  # same id, new port
        try:
            a.connect(1, c.address)
            c.connect(0, a.address)
            a.send(1, _fwd(0, mb=4))
            assert _recv_type(c, MessageType.FORWARD).microbatch == 4
            c.send(0, Message(MessageType.LEAVE, 1))
            assert _recv_type(a, MessageType.LEAVE).sender == 1
            assert a.dead_peers() == {1}
        finally:
            c.close()
    finally:
        a.close()


@pytest.mark.timeout(20)
def test_send_never_blocks_and_unsendable_messages_are_dropped_at_the_deadline() -> None:
    a = Transport(0, send_timeout=0.3, send_hwm=4)
    try:
        a.connect(5, "tcp://127.0.0.1:1")  # nobody listens: the PUSH socket never gets a connection
        t0 = time.monotonic()
        for i in range(100):
            a.send(5, _fwd(0, mb=i))
        assert time.monotonic() - t0 < 0.5
        deadline = time.monotonic() + 3.0
        while a.stats["dropped_unsent"] < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.stats["dropped_unsent"] >= 100 and a.stats["sent_messages"]["FORWARD"] == 0
        t1 = time.monotonic()
        a.close()
        assert time.monotonic() - t1 < 1.0
    finally:
        a.close()
