"""The routing plan (checkfree.swarm.routing; issue 39 point 4): shares of the global batch per node so that every
node of a stage finishes together, rounded to whole microbatches that add up exactly, and the bound it implies
against today's fixed routes."""

from __future__ import annotations

import pytest

from checkfree.swarm.routing import fixed_counts, largest_remainder, plan, stage_shares

MEMBERS = {0: [0, 1, 2], 1: [3, 4, 5], 2: [6, 7, 8]}


def test_equal_speeds_give_equal_shares() -> None:
    seconds = {s: dict.fromkeys(ids, 0.2) for s, ids in MEMBERS.items()}
    p = plan(seconds, MEMBERS, pipelines=3, microbatches=4)
    assert p.shares == {s: dict.fromkeys(ids, 4) for s, ids in MEMBERS.items()}
    assert (
        p.bound_s == pytest.approx(0.8) and p.fixed_s == pytest.approx(0.8) and p.plan_s == pytest.approx(0.8)
    )


def test_a_node_3x_slower_among_3_gets_a_seventh_of_its_stage() -> None:
    """By hand: nodes of 1, 1 and 3 s per microbatch finish together when x·1 = y·1 = z·3 = T with x + y + z = M,
    so z = T/3, x = y = T, T·(1 + 1 + 1/3) = M, T = 3M/7: the slow node gets z = M/7 and each fast one 3M/7. With
    M = 3 pipelines × 7 microbatches = 21: 9, 9, 3, and T = 9 s against 7 × 3 = 21 s on the fixed routes (each
    pipeline's 7 microbatches on its own node, the slow one's 7 × 3 s)."""
    shares, t = stage_shares({3: 1.0, 4: 3.0, 5: 1.0}, 21)
    assert shares == pytest.approx({3: 9.0, 4: 3.0, 5: 9.0}) and t == pytest.approx(9.0)
    seconds = {s: dict.fromkeys(ids, 1.0) for s, ids in MEMBERS.items()}
    seconds[1][4] = 3.0
    p = plan(seconds, MEMBERS, pipelines=3, microbatches=7)
    assert p.shares[1] == {3: 9, 4: 3, 5: 9}
    assert p.shares[1][4] / 21 == pytest.approx(1 / 7)
    assert (
        p.bound_s == pytest.approx(9.0)
        and p.plan_s == pytest.approx(9.0)
        and p.fixed_s == pytest.approx(21.0)
    )


@pytest.mark.parametrize(
    "speeds",
    [
        {3: 0.1, 4: 0.37, 5: 0.2},
        {3: 1.0, 4: 1.0, 5: 1.0},
        {3: 5.0, 4: 0.01, 5: 0.3},
        {3: 0.7, 4: 0.71, 5: 0.69},
    ],
)
def test_the_bound_is_at_most_the_fixed_routes_and_the_rounding_sums_exactly(
    speeds: dict[int, float],
) -> None:
    seconds = {s: dict.fromkeys(ids, 0.5) for s, ids in MEMBERS.items()}
    seconds[1] = speeds
    for microbatches in (1, 2, 5, 8):
        p = plan(seconds, MEMBERS, pipelines=3, microbatches=microbatches)
        assert p.bound_s <= p.fixed_s + 1e-9
        assert p.bound_s <= p.plan_s + 1e-9
        assert all(sum(nodes.values()) == 3 * microbatches for nodes in p.shares.values())


def test_largest_remainder_gives_the_leftovers_to_the_largest_fractions_ties_to_the_lower_id() -> None:
    assert largest_remainder({1: 2.5, 2: 2.5, 3: 1.0}, 6) == {1: 3, 2: 2, 3: 1}
    assert largest_remainder({1: 1.2, 2: 1.7, 3: 3.1}, 6) == {1: 1, 2: 2, 3: 3}
    assert largest_remainder({1: 10 / 3, 2: 10 / 3, 3: 10 / 3}, 10) == {1: 4, 2: 3, 3: 3}
    assert sum(largest_remainder({n: 21 / 9 for n in range(9)}, 21).values()) == 21


def test_a_short_stage_carries_its_missing_replicas_pipelines_on_the_fixed_routes() -> None:
    """Stage 1 lost node 4: pipeline 1's microbatches go round-robin to node 3 (checkfree.swarm.config.route)."""
    members = {0: [0, 1], 1: [3], 2: [6, 7]}
    assert fixed_counts(members, 2, 4) == {0: {0: 4, 1: 4}, 1: {3: 8}, 2: {6: 4, 7: 4}}


def test_an_unmeasured_node_takes_its_stages_median_and_a_bad_time_is_refused() -> None:
    seconds = {0: {0: 1.0, 1: 1.0, 2: 1.0}, 1: {3: 1.0, 5: 1.0}, 2: {}}
    p = plan(seconds, MEMBERS, pipelines=3, microbatches=2)
    assert p.shares[1] == {3: 2, 4: 2, 5: 2} and p.shares[2] == {6: 2, 7: 2, 8: 2}
    with pytest.raises(ValueError, match="expected positive finite"):
        stage_shares({3: 0.0, 4: 1.0}, 4)
    with pytest.raises(ValueError, match="without serving nodes"):
        stage_shares({}, 4)
