"""WAN emulation: per-link one-way latency and bandwidth with FIFO queueing (docs/paper.md §8).

The authors' emulator sleeps ``latency + n / bandwidth`` per send, so two concurrent sends over one link
each get the full bandwidth. Here a link is a FIFO queue: a message starts transmitting when the link is
free, occupies it for ``n / bandwidth`` seconds, and arrives ``latency`` seconds after its last byte left.
Two 1 MB sends issued together on a 1 MB/s, 10 ms link arrive at 1.01 s and 2.01 s, not both at 1.01 s.

Model choices:

* **One link per ordered node pair** ``(src node, dst node)``. The table's bandwidths were measured
  between two VMs (each machine has its own uplink), so two node pairs between the same two locations do
  not share bandwidth; a per-location-pair link would make the 3 Australian nodes sending to Belgium share
  one 0.0098 GiB/s pipe, which the measurements do not support. Sends from one node to one peer queue
  behind each other (activations behind a weight transfer, say). A node-wide uplink cap is not modelled.
* **Applied at the sender**: the transport computes the delivery time at ``send`` and hands the frames
  to the socket at that time, so the receiver sees the message no earlier than the model says. Each
  direction of a link is emulated by its own sender, so both sides of every link go through netem.
* **Time scale**: every delay is multiplied by ``time_scale`` (1 = real WAN time, 0.01 = 100x faster,
  0 = no emulation), so tests can run the same code paths quickly.

Everything here is pure arithmetic on an injectable clock (seconds, ``time.monotonic`` by default) and is
thread-safe.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from checkfree.swarm.topology import LinkSpec, LocationTable, load_locations, location_of

__all__ = ["Clock", "EmulatedLink", "LinkSpec", "NetEm", "SwarmNetEm"]

Clock = Callable[[], float]


class EmulatedLink:
    """A FIFO link: concurrent sends queue and share the bandwidth in order of ``reserve`` calls."""

    def __init__(self, spec: LinkSpec, time_scale: float = 1.0) -> None:
        if not math.isfinite(time_scale) or time_scale < 0:
            raise ValueError(f"time_scale is {time_scale!r}; expected a finite number >= 0.")
        self.spec = spec
        self.time_scale = time_scale
        self._free_at = -math.inf
        self._lock = threading.Lock()

    @property
    def free_at(self) -> float:
        """Clock time (seconds) at which the link finishes transmitting everything reserved so far."""
        with self._lock:
            return self._free_at

    def reserve(self, nbytes: int, now: float) -> float:
        """Book ``nbytes`` on the link at clock time ``now``; return the delivery time (seconds).

        Transmission starts at ``max(now, free_at)``, lasts ``nbytes / bandwidth * time_scale`` and the
        message arrives ``latency * time_scale`` after it ends.

        Raises:
            ValueError: if ``nbytes`` is negative.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes is {nbytes}; expected a size >= 0 bytes.")
        if self.time_scale == 0:
            return now
        with self._lock:
            start = max(now, self._free_at)
            self._free_at = start + nbytes / self.spec.bandwidth_bytes_per_s * self.time_scale
            return self._free_at + self.spec.latency_s * self.time_scale

    def latency_only(self, now: float) -> float:
        """Delivery time of a tiny control message that does not queue behind data (heartbeats).

        On a real link a heartbeat's packets interleave with a long transfer's; queueing it behind a
        27 s weight transfer would make a healthy peer look dead.
        """
        return now + self.spec.latency_s * self.time_scale


class NetEm:
    """Per-node-pair emulated links built from a location table.

    Args:
        table: the location table; ``None`` loads the one shipped with the package.
        locations: the geo set for ``location_of`` (node ``i`` sits at ``locations[i % len]``);
            ``None`` uses ``table.default_geo``.
        time_scale: multiplies every delay (1 = real time, 0 = no emulation).
        clock: monotonic clock in seconds; tests pass a fake one.
    """

    def __init__(
        self,
        table: LocationTable | None = None,
        locations: Sequence[str] | None = None,
        time_scale: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if not math.isfinite(time_scale) or time_scale < 0:
            raise ValueError(f"time_scale is {time_scale!r}; expected a finite number >= 0.")
        self.table = table if table is not None else load_locations()
        self.locations = tuple(locations) if locations is not None else self.table.default_geo
        self.time_scale = time_scale
        self.clock = clock
        self._node_locations: dict[int, str] = {}
        self._links: dict[tuple[int, int], EmulatedLink] = {}
        self._lock = threading.Lock()

    def set_location(self, node_id: int, location: str) -> None:
        """Pin a node to a location (a replacement node takes its predecessor's location, not id mod n)."""
        with self._lock:
            self._node_locations[node_id] = location
            for key in [k for k in self._links if node_id in k]:
                del self._links[key]

    def location(self, node_id: int) -> str:
        """The node's pinned location, else ``location_of(node_id, self.locations)``."""
        with self._lock:
            pinned = self._node_locations.get(node_id)
        return pinned if pinned is not None else location_of(node_id, self.locations)

    def link(self, src: int, dst: int) -> EmulatedLink:
        """The directed link from node ``src`` to node ``dst`` (created on first use)."""
        with self._lock:
            found = self._links.get((src, dst))
        if found is not None:
            return found
        spec = self.table.link(self.location(src), self.location(dst))
        with self._lock:
            return self._links.setdefault((src, dst), EmulatedLink(spec, self.time_scale))

    def forget(self, node_id: int) -> None:
        """Drop every link to or from ``node_id`` (it left; a node rejoining there starts with idle links)."""
        with self._lock:
            for key in [k for k in self._links if node_id in k]:
                del self._links[key]

    def reserve(self, src: int, dst: int, nbytes: int, now: float | None = None) -> float:
        """Book ``nbytes`` from ``src`` to ``dst``; return the delivery time on ``self.clock`` (seconds)."""
        return self.link(src, dst).reserve(nbytes, self.clock() if now is None else now)

    def latency_only(self, src: int, dst: int, now: float | None = None) -> float:
        """Delivery time of a heartbeat from ``src`` to ``dst``: latency only, no queueing (seconds)."""
        return self.link(src, dst).latency_only(self.clock() if now is None else now)


class SwarmNetEm(NetEm):
    """NetEm for swarm links; the supervisor's control plane (negative ids) is not emulated (it is measurement
    scaffolding, not part of the paper's protocol)."""

    def reserve(self, src: int, dst: int, nbytes: int, now: float | None = None) -> float:
        if src < 0 or dst < 0:
            return self.clock() if now is None else now
        return super().reserve(src, dst, nbytes, now)

    def latency_only(self, src: int, dst: int, now: float | None = None) -> float:
        if src < 0 or dst < 0:
            return self.clock() if now is None else now
        return super().latency_only(src, dst, now)
