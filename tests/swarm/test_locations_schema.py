"""The locations table's schema (checkfree.schemas.locations): unknown keys refused at every level, and each bound
accepted at its edge and refused just past it, each refusal one sentence naming the file, field and value."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from checkfree.schemas.fields import MAX_NAME
from checkfree.schemas.locations import MAX_BANDWIDTH_GIB_S, MAX_GEO, MAX_LATENCY_MS, MAX_LINKS
from checkfree.swarm.topology import GIB, TopologyError, load_locations, parse_locations


def _doc(**changes: object) -> dict:
    doc = {
        "default": {"latency_ms": 10, "bandwidth_gib_s": 0.5},
        "default_geo": ["A", "B"],
        "links": [{"a": "A", "b": "B", "latency_ms": 5, "bandwidth_gib_s": 0.1}],
    }
    doc.update(changes)
    return doc


def _link(**changes: object) -> list[dict]:
    return [{"a": "A", "b": "B", "latency_ms": 5, "bandwidth_gib_s": 0.1} | changes]


def _refused(doc: dict) -> str:
    with pytest.raises(TopologyError) as info:
        parse_locations(doc, "t.json")
    text = str(info.value)
    assert text.startswith("t.json: ") and text.endswith(".") and "\n" not in text
    return text


@pytest.mark.parametrize(
    "doc,expected",
    [
        (
            _doc(comment="x"),
            "unknown key 'comment'; expected some of ['default', 'default_geo', 'description'",
        ),
        (
            _doc(default={"latency_ms": 10, "bandwidth_gib_s": 0.5, "jitter_ms": 1}),
            "unknown key 'default.jitter_ms'; expected some of ['bandwidth_gib_s', 'latency_ms']",
        ),
        (
            _link(loss=0.1),
            "unknown key 'links[0].loss'; expected some of ['a', 'b', 'bandwidth_gib_s', 'latency_ms']",
        ),
    ],
)
def test_unknown_keys_are_refused_at_every_level(doc: dict, expected: str) -> None:
    assert expected in _refused(doc if "default" in doc else _doc(links=doc))


def test_an_unknown_key_in_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loc.json"
    path.write_text(json.dumps(_doc(links=_link(latency=5))))
    with pytest.raises(TopologyError, match=r"loc\.json: unknown key 'links\[0\]\.latency'"):
        load_locations(path)


def test_latency_bounds() -> None:
    assert parse_locations(_doc(links=_link(latency_ms=MAX_LATENCY_MS))).link("A", "B").latency_s == 60.0
    assert parse_locations(_doc(links=_link(latency_ms=0))).link("A", "B").latency_s == 0.0
    assert "'links[0].latency_ms' is 60001" in _refused(_doc(links=_link(latency_ms=MAX_LATENCY_MS + 1)))
    assert "'links[0].latency_ms' is -1;" in _refused(_doc(links=_link(latency_ms=-1)))
    assert "'default.latency_ms' is 60001" in _refused(
        _doc(default={"latency_ms": 60001, "bandwidth_gib_s": 1})
    )
    assert "'links[0].latency_ms' is True" in _refused(_doc(links=_link(latency_ms=True)))
    assert "'links[0].latency_ms' is nan" in _refused(_doc(links=_link(latency_ms=float("nan"))))


def test_bandwidth_bounds() -> None:
    table = parse_locations(_doc(links=_link(bandwidth_gib_s=MAX_BANDWIDTH_GIB_S)))
    assert table.link("A", "B").bandwidth_bytes_per_s == 1000 * GIB
    text = _refused(_doc(links=_link(bandwidth_gib_s=MAX_BANDWIDTH_GIB_S + 1)))
    assert "'links[0].bandwidth_gib_s' is 1001" in text and "≤ 1,000 (GiB/s)" in text
    assert "is 0; expected a positive number" in _refused(_doc(links=_link(bandwidth_gib_s=0)))
    assert "'links[0].bandwidth_gib_s' is inf" in _refused(_doc(links=_link(bandwidth_gib_s=float("inf"))))


def _links(n: int) -> list[dict]:
    pairs = itertools.combinations([f"L{i}" for i in range(200)], 2)
    return [{"a": a, "b": b, "latency_ms": 1, "bandwidth_gib_s": 1} for a, b in itertools.islice(pairs, n)]


def test_links_bound() -> None:
    assert len(parse_locations(_doc(links=_links(MAX_LINKS), default_geo=["L0"])).links) == MAX_LINKS
    text = _refused(_doc(links=_links(MAX_LINKS + 1), default_geo=["L0"]))
    assert "'links' is [" in text and "expected a list of at most 10,000 objects" in text


def test_default_geo_bounds() -> None:
    assert len(parse_locations(_doc(default_geo=["A"] * MAX_GEO)).default_geo) == MAX_GEO
    assert "'default_geo' is ['A'," in _refused(_doc(default_geo=["A"] * (MAX_GEO + 1)))
    assert "'default_geo' is []; expected a list of 1 to 4,096" in _refused(_doc(default_geo=[]))
    assert "'default_geo[1]' is ''" in _refused(_doc(default_geo=["A", ""]))


def test_name_and_description_bounds() -> None:
    long = "x" * MAX_NAME
    assert parse_locations(_doc(links=_link(b=long), default_geo=[long])).names == {"A", long}
    assert "'links[0].b' is 'xxx" in _refused(_doc(links=_link(b=long + "x"), default_geo=["A"]))
    assert "'links[0].a' is ''; expected a location name" in _refused(_doc(links=_link(a="")))
    assert parse_locations(_doc(description=long)).names == {"A", "B"}
    assert "'description' is 'xxx" in _refused(_doc(description=long + "x"))
