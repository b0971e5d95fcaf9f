"""The transport's copies: snapshots at send (reused buffers) and zero-copy tensors at receive."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch
import zmq

from checkfree.swarm.wire import receiver
from checkfree.swarm.wire.protocol import ZERO_COPY_MIN_BYTES, Message, MessageType, decode, encode
from checkfree.swarm.wire.send_buffers import MIN_POOLED_BYTES, SnapshotPool
from checkfree.swarm.wire.transport import Transport

BIG = 256 * 1024  # float32 elements: 1 MiB, pooled and received zero-copy


def _released(pool: SnapshotPool, n: int, timeout: float = 5.0) -> bool:
    """True once every buffer of ``n`` bytes in the pool is idle (pyzmq signals releases from a thread)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if all(t.done for _, t in pool._buffers.get(n, [])):
            return True
        time.sleep(0.01)
    return False


def _inproc_pair() -> tuple[zmq.Context, zmq.Socket, zmq.Socket]:
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://buffers")
    b.connect("inproc://buffers")
    return ctx, a, b


@pytest.mark.timeout(20)
def test_a_snapshot_is_a_copy_and_its_buffer_is_reused_only_after_libzmq_released_it() -> None:
    pool = SnapshotPool(max_bytes=4 * MIN_POOLED_BYTES)
    data = np.zeros(MIN_POOLED_BYTES, dtype=np.uint8)
    ctx, a, b = _inproc_pair()
    try:
        frame = pool.snapshot(data)
        data[:] = 7  # the caller changes its tensor right after send
        a.send(frame, copy=False)
        busy = pool.snapshot(data)  # the first buffer is still held (by the frame and libzmq)
        assert pool.held_bytes == 2 * MIN_POOLED_BYTES
        assert bytes(b.recv(copy=False).buffer[:1]) == b"\0"
        del frame, busy
        assert _released(pool, MIN_POOLED_BYTES)
        again = pool.snapshot(data)
        assert pool.held_bytes == 2 * MIN_POOLED_BYTES  # reused, not a third buffer
        assert bytes(again.buffer[:1]) == b"\x07"
        assert isinstance(pool.snapshot(np.zeros(10, dtype=np.uint8)), memoryview)  # small: plain copy
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


def test_a_full_pool_copies_plainly_and_evicts_idle_buffers_of_other_sizes() -> None:
    pool = SnapshotPool(max_bytes=3 * MIN_POOLED_BYTES)
    frames = [pool.snapshot(np.ones(MIN_POOLED_BYTES, dtype=np.uint8)) for _ in range(3)]
    extra = pool.snapshot(np.ones(MIN_POOLED_BYTES, dtype=np.uint8))
    assert isinstance(extra, memoryview) and pool.held_bytes == 3 * MIN_POOLED_BYTES
    del frames
    assert _released(pool, MIN_POOLED_BYTES)
    other = pool.snapshot(np.ones(2 * MIN_POOLED_BYTES, dtype=np.uint8))  # evicts the idle small buffers
    assert isinstance(other, zmq.Frame) and pool.held_bytes == 2 * MIN_POOLED_BYTES


def test_zero_copy_decode_views_writable_frames_and_copies_the_rest() -> None:
    big, small = torch.arange(BIG, dtype=torch.float32), torch.arange(10, dtype=torch.float32)
    msg = Message(MessageType.FORWARD, 1, 0, 0, {"stage": 0}, {"activations": big, "small": small})
    ctx, a, b = _inproc_pair()
    try:
        a.send_multipart(encode(msg, copy=True))
        frames = b.recv_multipart(copy=False)
        out = decode(frames, zero_copy=True)
        view = np.frombuffer(frames[3].buffer, dtype=np.float32)
        assert out.tensors["activations"].data_ptr() == view.ctypes.data  # no copy
        out.tensors["activations"] += 1  # writable, and only this message's memory
        assert view[0] == 1.0 and torch.equal(out.tensors["small"], small)
        assert decode(frames).tensors["activations"].data_ptr() != view.ctypes.data  # default: a copy
        as_bytes = decode([bytes(f.buffer) for f in frames], zero_copy=True)  # read-only frames: copied
        assert as_bytes.tensors["activations"][0] == 1.0 and as_bytes.tensors["activations"].numel() == BIG
        assert BIG * 4 >= ZERO_COPY_MIN_BYTES
    finally:
        a.close(0)
        b.close(0)
        ctx.term()


@pytest.mark.timeout(30)
def test_large_tensors_changed_right_after_send_arrive_as_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    zero_copy: list[bool] = []

    def spy(frames: list, limit: int, zero_copy_: bool = False, **kw: bool) -> Message:
        zero_copy.append(kw.get("zero_copy", zero_copy_))
        return decode(frames, limit, zero_copy=zero_copy[-1])

    monkeypatch.setattr(receiver, "decode", spy)
    with Transport(0) as a, Transport(1) as b:
        a.connect(1, b.address)
        t = torch.zeros(BIG)
        for mb in range(20):
            t.fill_(mb)
            a.send(1, Message(MessageType.FORWARD, 0, 1, mb, {"stage": 0}, {"activations": t}))
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 20 and time.monotonic() < deadline:
            msg = b.recv(timeout=1.0)
            if msg is not None:
                got.append(msg)
        assert [m.microbatch for m in got] == list(range(20))
        for m in got:
            x = m.tensors["activations"]
            assert x.min().item() == x.max().item() == m.microbatch
        got[0].tensors["activations"] += 100  # received tensors are independent of each other
        assert got[1].tensors["activations"][0].item() == 1
        assert zero_copy and all(zero_copy)  # the receiver leaves large tensors in their frames


def test_buffers_idle_longer_than_idle_s_are_forgotten() -> None:
    pool = SnapshotPool(idle_s=0.0)
    frame = pool.snapshot(np.ones(2 * MIN_POOLED_BYTES, dtype=np.uint8))
    del frame
    assert _released(pool, 2 * MIN_POOLED_BYTES)
    time.sleep(0.01)
    kept = pool.snapshot(np.ones(MIN_POOLED_BYTES, dtype=np.uint8))
    assert isinstance(kept, zmq.Frame) and pool.held_bytes == MIN_POOLED_BYTES
