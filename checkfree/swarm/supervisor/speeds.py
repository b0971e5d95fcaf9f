"""The supervisor's per-node speed estimates, the routing plan they give and fail-slow detection (issue 39 point 4).

Measurement: every node's ``committed`` carries ``microbatch_s``, the mean wall seconds per microbatch (forward +
backward; stage 0: embedding, head and loss, embedding backward) of the attempt that committed
(checkfree.swarm.node.compute ``StageWorker.microbatch_seconds``). A node's first report is left out: its first
iteration pays one-off set-up (the first autograd graphs, allocations), which made a live tiny swarm's nodes differ
by 2× and more at iteration 0 (so a replacement too is measured from its second iteration). The estimate is an
exponentially weighted moving average with weight :data:`EWMA_WEIGHT` on the newest iteration: a node that turns f×
slow is estimated at ``f − (f − 1)·(1 − w)^k`` of its old speed k iterations later (w = 0.5: 2.5× one iteration
after turning 4× slow, 3.6× after three), fast enough to cut its share within three iterations, smooth enough that
one noisy iteration on a shared machine moves it only halfway. A node's links add the netem model's transfer seconds
of one microbatch's activations (batch × sequence × d_model float32) to and from the serving nodes of the stage
before it (stage 0: the last stage), in both directions: the emulated WAN's latency + bytes / bandwidth, as
benchmarks/bench_swarm.py's bound counts them, not a second clock (checkfree.swarm.topology
``LinkSpec.transfer_time``).

Fail-slow: a node whose estimate exceeds :data:`FAIL_SLOW_FACTOR` × the median estimate of its stage's other serving
nodes (its peers: with two replicas a median over both would hide a slow one) is named once, from the iteration it
first did, in throughput.json's ``fail_slow`` (node, stage, factor = estimate / the peers' median, since iteration)
and in one warning; it is named again only after it recovered below 1.5× (:data:`RECOVERED_FACTOR`: hysteresis, so a
node hovering about 2× is named once, not every other iteration). It must also be :data:`FAIL_SLOW_MIN_S` (5 ms) per
microbatch slower than that median, so the noise of millisecond passes is not a node's slowness. A stage of one node
has no peers to compare with. 2× is above the noise of replicas on one shared machine (passes of tens of ms differ
by tens of percent) and below the 3× of the emulation's tests.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from checkfree.swarm.routing import RoutingPlan, plan
from checkfree.swarm.topology import LocationTable

log = logging.getLogger(__name__)

EWMA_WEIGHT = 0.5
"""Weight of the newest iteration's seconds per microbatch in a node's estimate."""
FAIL_SLOW_FACTOR = 2.0
"""A node slower than this × its peers' median estimate (and by :data:`FAIL_SLOW_MIN_S`) is fail-slow."""
RECOVERED_FACTOR = 1.5
"""A fail-slow node is forgotten only once its estimate is at most this × its peers' median: a node hovering about
:data:`FAIL_SLOW_FACTOR` on a loaded machine was named every other iteration without it."""
FAIL_SLOW_MIN_S = 0.005
"""Seconds per microbatch by which a fail-slow node must also exceed its peers' median: below it, a few ms of
scheduling on a shared machine made a live tiny swarm's stage-0 node (about 1 ms per microbatch) look 4× slow."""


class Speeds:
    """Per-node moving estimates of seconds per microbatch (compute + links), the plan and fail-slow nodes.

    Args:
        table: the locations' link table; time_scale: the swarm config's (multiplies every emulated delay);
        activation_bytes: bytes of one microbatch's activations on the wire.
    """

    def __init__(self, table: LocationTable, time_scale: float, activation_bytes: int) -> None:
        self.table, self.time_scale, self.activation_bytes = table, time_scale, activation_bytes
        self.compute: dict[int, float] = {}
        """Node → EWMA of its compute seconds per microbatch."""
        self.warmed: set[int] = set()
        """Nodes whose first (warm-up) report was seen and left out."""
        self.flagged: dict[int, dict[str, Any]] = {}
        """Node → its open fail-slow record (node, stage, factor, since)."""

    def observe(self, reports: dict[int, dict[str, Any]]) -> None:
        """Take the ``microbatch_s`` of the ``committed`` reports (node → meta) of one iteration."""
        for node, meta in sorted(reports.items()):
            seconds = meta.get("microbatch_s")
            if seconds is None:
                continue
            if node not in self.warmed:  # its first iteration: lazy set-up, not its speed
                self.warmed.add(node)
                continue
            old = self.compute.get(node)
            self.compute[node] = (
                float(seconds) if old is None else EWMA_WEIGHT * float(seconds) + (1 - EWMA_WEIGHT) * old
            )

    def link_seconds(
        self, node: int, stage: int, members: dict[int, list[int]], where: dict[int, str]
    ) -> float:
        """Netem seconds of one microbatch's activations to and from ``node`` over its links with the previous
        stage's serving nodes (their mean; stage 0: the last stage), both directions; 0 where a location is
        unknown."""
        before = members.get(stage - 1 if stage > 0 else max(members), [])
        if node not in where or not before:
            return 0.0
        seconds = [
            self.table.link(where[m], where[node]).transfer_time(self.activation_bytes)
            + self.table.link(where[node], where[m]).transfer_time(self.activation_bytes)
            for m in before
            if m in where
        ]
        return self.time_scale * statistics.mean(seconds) if seconds else 0.0

    def routing_plan(
        self, members: dict[int, list[int]], where: dict[int, str], pipelines: int, microbatches: int
    ) -> RoutingPlan:
        """The plan (checkfree.swarm.routing) for stage → serving nodes ``members`` (``where``: node → location)."""
        seconds = {
            s: {
                n: self.compute[n] + self.link_seconds(n, s, members, where)
                for n in nodes
                if self.compute.get(n, 0.0) > 0
            }
            for s, nodes in members.items()
        }
        return plan(seconds, {s: ids for s, ids in members.items() if ids}, pipelines, microbatches)

    def fail_slow(self, members: dict[int, list[int]], iteration: int) -> list[dict[str, Any]]:
        """The nodes that turned fail-slow at ``iteration`` (records: node, stage, factor, since), each once; a
        node back at or below :data:`RECOVERED_FACTOR` × its peers' median (or gone) is forgotten."""
        new = []
        still: set[int] = set()
        for stage, nodes in sorted(members.items()):
            known = {n: self.compute[n] for n in nodes if n in self.compute}
            for n, est in sorted(known.items()):
                peers = [v for m, v in known.items() if m != n]
                median = statistics.median(peers) if peers else 0.0
                if n in self.flagged and median > 0 and est > RECOVERED_FACTOR * median:
                    still.add(n)  # named already: kept until clearly back (hysteresis)
                elif median > 0 and est > FAIL_SLOW_FACTOR * median and est - median > FAIL_SLOW_MIN_S:
                    still.add(n)
                    if n not in self.flagged:
                        record = {"node": n, "stage": stage, "factor": est / median, "since": iteration}
                        self.flagged[n] = record
                        new.append(record)
                        log.warning(
                            "supervisor: node %d (stage %d) is fail-slow: %.3f s per microbatch, %.1f x its "
                            "peers' median, from iteration %d",
                            n,
                            stage,
                            est,
                            est / median,
                            iteration,
                        )
        for n in [n for n in self.flagged if n not in still]:
            del self.flagged[n]
        return new
