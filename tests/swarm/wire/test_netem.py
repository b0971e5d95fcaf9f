"""WAN model: FIFO link arithmetic checked against hand-computed times, and the docs/paper.md §8 location table."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from checkfree.swarm.topology import (
    GIB,
    TopologyError,
    load_locations,
    location_of,
    parse_locations,
)
from checkfree.swarm.wire.netem import EmulatedLink, LinkSpec, NetEm

from helpers import ROOT

MB = 1_000_000


class FakeClock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_fifo_link_queues_concurrent_sends() -> None:
    link = EmulatedLink(LinkSpec(latency_s=0.010, bandwidth_bytes_per_s=1 * MB))
    # Two 1 MB sends at t=0: the second waits for the first's last byte (1 s), then takes 1 s more.
    assert link.reserve(MB, now=0.0) == pytest.approx(1.010)
    assert link.reserve(MB, now=0.0) == pytest.approx(2.010)
    # At t=1.5 the link is busy until 2.0: 0.5 MB starts at 2.0, ends 2.5, arrives 2.51.
    assert link.reserve(MB // 2, now=1.5) == pytest.approx(2.510)
    # After the link drained, a send starts at once: 10 s + 0.25 s + 0.01 s.
    assert link.reserve(MB // 4, now=10.0) == pytest.approx(10.260)
    assert link.free_at == pytest.approx(10.250)


def test_latency_only_ignores_the_queue_and_zero_bytes_cost_latency() -> None:
    link = EmulatedLink(LinkSpec(0.1, MB))
    link.reserve(5 * MB, now=0.0)
    assert link.latency_only(now=1.0) == pytest.approx(1.1)
    assert link.reserve(0, now=6.0) == pytest.approx(6.1)


def test_time_scale_scales_every_delay_and_zero_disables() -> None:
    half = EmulatedLink(LinkSpec(0.010, MB), time_scale=0.5)
    assert half.reserve(MB, 0.0) == pytest.approx(0.505)
    assert half.reserve(MB, 0.0) == pytest.approx(1.005)
    off = EmulatedLink(LinkSpec(0.010, MB), time_scale=0.0)
    assert off.reserve(10 * MB, 3.0) == 3.0


def test_reserve_is_thread_safe() -> None:
    link = EmulatedLink(LinkSpec(0.0, 1000.0))
    times: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            t = link.reserve(1, now=0.0)
            with lock:
                times.append(t)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # 1600 one-byte sends at 1000 B/s: each occupies exactly 1 ms, none overlaps.
    assert sorted(round(t * 1000) for t in times) == list(range(1, 1601))


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        (dict(latency_s=-0.1, bandwidth_bytes_per_s=1.0), "latency"),
        (dict(latency_s=0.1, bandwidth_bytes_per_s=0.0), "bandwidth"),
        (dict(latency_s=float("nan"), bandwidth_bytes_per_s=1.0), "latency"),
    ],
)
def test_linkspec_rejects_impossible_links(kwargs: dict, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        LinkSpec(**kwargs)


def test_netem_links_are_per_node_pair_and_directional() -> None:
    clock = FakeClock()
    net = NetEm(clock=clock)
    spec = net.table.link("Australia", "Belgium")
    assert spec == LinkSpec(0.129, 0.00982666 * GIB)
    size = 10 * MB
    one = spec.transfer_time(size)
    # nodes 0 (Australia) -> 1 (Belgium): the second send queues behind the first
    assert net.reserve(0, 1, size) == pytest.approx(one)
    assert net.reserve(0, 1, size) == pytest.approx(one + size / spec.bandwidth_bytes_per_s)
    # another machine pair between the same two locations has its own uplink; so does the reverse direction
    assert net.reserve(7, 8, size) == pytest.approx(one)
    assert net.reserve(1, 0, size) == pytest.approx(one)
    clock.t = 100.0
    assert net.reserve(0, 1, size) == pytest.approx(100.0 + one)


def test_netem_pinned_location_and_forget() -> None:
    net = NetEm(clock=FakeClock(), locations=["Iowa", "Iowa"])
    assert net.location(5) == "Iowa"
    assert net.reserve(0, 1, 0) == pytest.approx(0.010)  # same location: default 10 ms
    net.reserve(0, 1, 10**9)
    net.set_location(1, "Canada")  # a replacement node keeps its predecessor's location; links restart idle
    assert net.location(1) == "Canada"
    assert net.reserve(0, 1, 0) == pytest.approx(0.014)
    net.reserve(0, 1, 10**9)
    net.forget(1)
    assert net.reserve(0, 1, 0) == pytest.approx(0.014)


def test_shipped_table_matches_spec_and_the_communication_copy() -> None:
    table = load_locations()
    assert len(table.links) == 66 and len(table.names) == 12
    assert table.default == LinkSpec(0.010, 0.5 * GIB)
    assert table.default_geo == ("Australia", "Belgium", "Canada", "Germany", "Iowa", "NL", "London")
    assert table.link("NL", "London") == table.link("London", "NL") == LinkSpec(0.0048, 0.0236816 * GIB)
    assert table.link("Iowa", "Iowa") == table.default
    assert table.link("Mars", "Iowa") == table.default
    package = ROOT / "checkfree" / "swarm" / "locations.json"
    copy = ROOT / "communication" / "locations.json"
    assert copy.read_bytes() == package.read_bytes(), (
        "communication/locations.json drifted from the package copy"
    )
    assert load_locations(copy) == table


def test_location_of_wraps_node_ids() -> None:
    geo = list(load_locations().default_geo)
    assert [location_of(i, geo) for i in (0, 6, 7, 20)] == ["Australia", "London", "Australia", "London"]
    with pytest.raises(TopologyError, match="empty"):
        location_of(0, [])
    with pytest.raises(TopologyError, match="negative"):
        location_of(-1, geo)


def _doc(**changes: object) -> dict:
    doc = {
        "default": {"latency_ms": 10, "bandwidth_gib_s": 0.5},
        "default_geo": ["A", "B"],
        "links": [{"a": "A", "b": "B", "latency_ms": 5, "bandwidth_gib_s": 0.1}],
    }
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    "doc,expected",
    [
        (
            _doc(links=[{"a": "A", "b": "B", "latency_ms": -5, "bandwidth_gib_s": 0.1}]),
            "'links[0].latency_ms' is -5; expected a finite number ≥ 0",
        ),
        (
            _doc(links=[{"a": "A", "b": "B", "latency_ms": 5, "bandwidth_gib_s": 0}]),
            "'links[0].bandwidth_gib_s' is 0; expected a positive number",
        ),
        (_doc(links=[{"a": "A", "b": "B", "latency_ms": "5", "bandwidth_gib_s": 1}]), "finite number"),
        (_doc(default_geo=["A", "Narnia"]), "unknown location 'Narnia'"),
        (_doc(links=[{"a": "A", "b": "A", "latency_ms": 1, "bandwidth_gib_s": 1}]), "to itself"),
        (_doc(links=_doc()["links"] * 2), "repeats the pair"),
        ({"links": []}, "the field 'default' is missing"),
        ([], "expected a JSON object"),
    ],
)
def test_parse_locations_errors_are_sentences(doc: object, expected: str) -> None:
    with pytest.raises(TopologyError) as info:
        parse_locations(doc, "t.json")
    assert expected in str(info.value) and str(info.value).endswith(".")


def test_load_locations_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TopologyError, match="not valid JSON"):
        load_locations(bad)
    with pytest.raises(TopologyError, match="Cannot read"):
        load_locations(tmp_path / "missing.json")
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc()))
    assert load_locations(good).link("B", "A") == LinkSpec(0.005, 0.1 * GIB)
