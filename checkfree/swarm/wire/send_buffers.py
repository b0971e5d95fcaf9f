"""Snapshots of outgoing tensor bytes in reused, already-faulted buffers (the send side of the transport).

``Transport.send`` returns before libzmq has read the message (its I/O thread encrypts and writes it later),
and the caller may change a tensor in place right after ``send`` (zero gradients, step weights), so the
bytes of every tensor are copied at ``send``. A fresh 4 MiB allocation per copy costs a page fault per
4 KiB page (1,024 faults, the kernel zeroing each page): on a 2-core machine that was 4 ms per 4 MiB
message, 3x the copy itself. This pool keeps the copies' buffers and hands one out again once libzmq has
released it (pyzmq's ``MessageTracker`` of a zero-copy frame says so), so a steady stream of same-sized
messages copies into warm memory. Small tensors (below ``MIN_POOLED_BYTES``) are copied plainly: pyzmq
copies them anyway and tracking them costs more than it saves. The pool keeps at most ``POOL_BYTES`` and
forgets a buffer idle for ``IDLE_S`` seconds (a one-off weights answer does not stay in memory).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

import numpy as np
import zmq

MIN_POOLED_BYTES = 64 * 1024
"""Tensors at least this large (bytes) are copied into pooled buffers."""
POOL_BYTES = 256 * 1024**2
"""Most bytes the pool keeps, busy and idle buffers together; beyond it a copy is a one-off allocation."""
IDLE_S = 10.0
"""A buffer not reused for this many seconds is forgotten."""


class SnapshotPool:
    """Reusable buffers for the copies ``send`` takes; thread-safe (``send`` may run on any thread).

    Args:
        max_bytes: most bytes of buffers kept (busy ones, still held by libzmq, included).
    """

    def __init__(self, max_bytes: int = POOL_BYTES, idle_s: float = IDLE_S) -> None:
        self.max_bytes, self.idle_s = max_bytes, idle_s
        self._lock = threading.Lock()
        self._buffers: OrderedDict[int, list[tuple[np.ndarray, zmq.MessageTracker]]] = OrderedDict()
        self._used: dict[int, float] = {}  # size -> when a buffer of that size was last handed out
        self._held = 0
        self._swept = time.monotonic()

    @property
    def held_bytes(self) -> int:
        """Bytes of buffers the pool keeps now."""
        with self._lock:
            return self._held

    def snapshot(self, data: np.ndarray) -> memoryview | zmq.Frame:
        """A frame holding a copy of ``data`` (1-D uint8), safe to send after ``data`` changes.

        Returns a zero-copy ``zmq.Frame`` over a pooled buffer (its tracker frees the buffer for reuse when
        libzmq drops the message), or a memoryview of a plain copy (small data, or the pool is full).
        """
        n = data.nbytes
        if n < MIN_POOLED_BYTES:
            return memoryview(data.tobytes())
        with self._lock:
            self._sweep(time.monotonic())
            buf = self._take(n)
        if buf is None:
            return memoryview(data.tobytes())
        np.copyto(buf, data)
        frame = zmq.Frame(buf, copy=False, track=True)
        with self._lock:
            self._buffers.setdefault(n, []).append((buf, frame.tracker))
        return frame

    def _take(self, n: int) -> np.ndarray | None:
        """An idle buffer of ``n`` bytes, a new one if the pool has room, else None (``_lock`` held)."""
        entries = self._buffers.get(n, [])
        self._used[n] = time.monotonic()
        for i, (buf, tracker) in enumerate(entries):
            if tracker.done:
                del entries[i]
                self._buffers.move_to_end(n)
                return buf
        if self._held + n > self.max_bytes:
            self._evict(self._held + n - self.max_bytes)
        if self._held + n > self.max_bytes:
            return None
        self._held += n
        return np.empty(n, dtype=np.uint8)

    def _evict(self, need: int) -> None:
        """Forget idle buffers of the least recently used sizes until ``need`` bytes are free (``_lock``
        held); busy buffers stay (libzmq still reads them)."""
        for size in list(self._buffers):
            entries = self._buffers[size]
            keep = [(b, t) for b, t in entries if not t.done]
            freed = (len(entries) - len(keep)) * size
            self._held -= freed
            need -= freed
            if keep:
                self._buffers[size] = keep
            else:
                del self._buffers[size]
            if need <= 0:
                return

    def _sweep(self, now: float) -> None:
        """Forget the idle buffers of sizes not handed out for ``idle_s`` seconds (``_lock`` held; runs at
        most once a second)."""
        if now - self._swept < min(1.0, self.idle_s):
            return
        self._swept = now
        for size in [s for s in self._buffers if now - self._used.get(s, now) > self.idle_s]:
            entries = self._buffers.pop(size)
            keep = [(b, t) for b, t in entries if not t.done]
            self._held -= (len(entries) - len(keep)) * size
            if keep:
                self._buffers[size] = keep
