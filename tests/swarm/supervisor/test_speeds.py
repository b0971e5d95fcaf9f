"""The supervisor's speed estimates (checkfree.swarm.supervisor.speeds; issue 39 point 4): an EWMA of each node's
``microbatch_s``, the netem seconds of its links, the routing plan they give and the fail-slow nodes."""

from __future__ import annotations

import logging

import pytest

from checkfree.swarm.supervisor.speeds import (
    EWMA_WEIGHT,
    FAIL_SLOW_FACTOR,
    FAIL_SLOW_MIN_S,
    RECOVERED_FACTOR,
    Speeds,
)
from checkfree.swarm.topology import LinkSpec, LocationTable

MEMBERS = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}
TABLE = LocationTable(
    {frozenset(("A", "B")): LinkSpec(0.05, 1e6)}, LinkSpec(0.01, 1e7), ("A", "B"), frozenset(("A", "B"))
)


def _iteration(speeds: Speeds, seconds: dict[int, float]) -> None:
    speeds.observe({n: {"microbatch_s": s, "command": "committed"} for n, s in seconds.items()})


def _speeds(time_scale: float = 0.0) -> Speeds:
    """Speeds whose nodes 0..99 are past their warm-up report."""
    speeds = Speeds(TABLE, time_scale, activation_bytes=10_000)
    speeds.warmed.update(range(100))
    return speeds


def test_a_nodes_first_report_is_its_warm_up_and_left_out() -> None:
    speeds = Speeds(TABLE, 0.0, activation_bytes=10_000)
    _iteration(speeds, {3: 9.0, 4: 1.0})
    assert speeds.compute == {}
    _iteration(speeds, {3: 1.0})
    assert speeds.compute == {3: 1.0}
    _iteration(speeds, {4: 2.0})
    assert speeds.compute == {3: 1.0, 4: 2.0}


def test_the_estimate_is_an_ewma_of_the_reports_and_skips_reports_without_one() -> None:
    speeds = _speeds()
    _iteration(speeds, {3: 1.0})
    assert speeds.compute == {3: 1.0}  # the first report as it is
    _iteration(speeds, {3: 4.0})
    assert speeds.compute[3] == pytest.approx(EWMA_WEIGHT * 4.0 + (1 - EWMA_WEIGHT) * 1.0) == 2.5
    speeds.observe({3: {"command": "committed"}, 4: {"microbatch_s": 2.0}})
    assert speeds.compute == {3: 2.5, 4: 2.0}


def test_a_node_turning_4x_slow_has_its_share_cut_within_3_iterations_and_is_named_once(caplog) -> None:
    speeds = _speeds()
    everyone = {n: 0.1 for ids in MEMBERS.values() for n in ids}
    for it in range(3):
        _iteration(speeds, everyone)
        assert speeds.fail_slow(MEMBERS, it) == []
        assert speeds.routing_plan(MEMBERS, {}, 3, 4).shares[1] == {3: 4, 4: 4, 5: 4}
    caplog.set_level(logging.WARNING)
    named = []
    for it in range(3, 6):
        _iteration(speeds, everyone | {4: 0.4})
        named += speeds.fail_slow(MEMBERS, it)
        share = speeds.routing_plan(MEMBERS, {}, 3, 4).shares[1][4]
        assert share < 4, (it, share)  # cut from the first iteration it ran slow
    assert [(r["node"], r["stage"], r["since"]) for r in named] == [(4, 1, 3)]
    assert named[0]["factor"] == pytest.approx(2.5)  # the EWMA one iteration after: 0.25 s against 0.1 s
    assert sum("node 4 (stage 1) is fail-slow" in r.getMessage() for r in caplog.records) == 1
    plan = speeds.routing_plan(MEMBERS, {}, 3, 4)
    assert plan.shares[1] == {3: 5, 4: 2, 5: 5} and plan.bound_s < plan.fixed_s  # EWMA 0.3625 s: 1.45 of 12


def test_fail_slow_compares_with_the_peers_median_so_two_replicas_suffice_and_the_factor_is_strict() -> None:
    speeds = _speeds()
    two = {0: [0, 1], 1: [2, 3]}
    _iteration(speeds, {0: 1.0, 1: 1.0, 2: 1.0, 3: FAIL_SLOW_FACTOR})
    assert speeds.fail_slow(two, 0) == []  # exactly the factor: not above it
    _iteration(speeds, {3: 3 * FAIL_SLOW_FACTOR})  # EWMA 4.0: 4 × its peer
    assert [(r["node"], r["factor"]) for r in speeds.fail_slow(two, 1)] == [(3, pytest.approx(4.0))]
    assert speeds.fail_slow(two, 2) == []  # named once
    for _ in range(4):
        _iteration(speeds, {3: 1.0})
    assert speeds.fail_slow(two, 3) == [] and 3 not in speeds.flagged  # back below: forgotten
    _iteration(speeds, {3: 20.0})
    assert [r["since"] for r in speeds.fail_slow(two, 4)] == [4]  # named again


def test_a_named_node_is_forgotten_only_once_clearly_back() -> None:
    """Hysteresis: named above 2×, kept while above 1.5×, forgotten at 1.5× or below, then named anew above 2×."""
    speeds = _speeds()
    two = {0: [0, 1], 1: [2, 3]}
    speeds.compute.update({2: 0.1, 3: 0.25})
    assert [r["node"] for r in speeds.fail_slow(two, 0)] == [3]
    speeds.compute[3] = 0.19  # below 2×, above 1.5×: still named, not again
    assert speeds.fail_slow(two, 1) == [] and 3 in speeds.flagged
    speeds.compute[3] = RECOVERED_FACTOR * 0.1
    assert speeds.fail_slow(two, 2) == [] and 3 not in speeds.flagged
    speeds.compute[3] = 0.19  # 1.9×: not named
    assert speeds.fail_slow(two, 3) == []
    speeds.compute[3] = 0.21
    assert [r["since"] for r in speeds.fail_slow(two, 4)] == [4]


def test_a_node_must_also_be_slower_by_the_absolute_margin() -> None:
    """Peers at 1 ms: 4 ms is 4× but only 3 ms slower (noise); 1 ms + the margin + 0.1 ms is slow."""
    speeds = _speeds()
    two = {0: [0, 1], 1: [2, 3]}
    _iteration(speeds, {2: 0.001, 3: 0.004})
    assert speeds.fail_slow(two, 0) == []
    _iteration(speeds, {3: 2 * (0.001 + FAIL_SLOW_MIN_S + 0.0001) - 0.004})  # EWMA: 1 ms + margin + 0.1 ms
    assert [r["node"] for r in speeds.fail_slow(two, 1)] == [3]


def test_a_nodes_links_are_the_netem_seconds_of_a_microbatch_to_and_from_the_stage_before() -> None:
    """Node 3 (stage 1) at B, the previous stage's nodes at A and B: the mean of (A→B + B→A) and (B→B + B→B),
    each latency + bytes / bandwidth, scaled by time_scale; stage 0's previous stage is the last."""
    speeds = _speeds(time_scale=2.0)
    where = {0: "A", 1: "B", 3: "B", 6: "A"}
    members = {0: [0, 1], 1: [3], 2: [6]}
    far = 0.05 + 10_000 / 1e6
    near = 0.01 + 10_000 / 1e7
    assert speeds.link_seconds(3, 1, members, where) == pytest.approx(2.0 * (2 * far + 2 * near) / 2)
    assert speeds.link_seconds(0, 0, members, where) == pytest.approx(
        2.0 * 2 * near
    )  # from node 6, both at A
    assert speeds.link_seconds(1, 0, members, where) == pytest.approx(2.0 * 2 * far)
    assert _speeds(time_scale=0.0).link_seconds(3, 1, members, where) == 0.0
    assert speeds.link_seconds(9, 1, members, where) == 0.0  # location unknown
