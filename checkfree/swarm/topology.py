"""The WAN topology of the swarm: a table of links between locations, and which node sits where.

The table (docs/paper.md §8, measured by the CheckFree authors on Google Cloud) gives a one-way latency in
milliseconds and a bandwidth in GiB/s for each unordered pair of locations. Pairs not in the table and
same-location pairs use the table's default (10 ms, 0.5 GiB/s, as in the authors' trainer).

The canonical data file is ``checkfree/swarm/locations.json`` (shipped inside the package and read with
``importlib.resources`` so the library works from any directory); ``communication/locations.json`` is a
copy for the launchers, kept byte-equal by ``tests/swarm/wire/test_netem.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from checkfree.config_files import ConfigFileError, read_mapping

GIB = 1024**3
"""Bytes in one GiB: the table's bandwidths are GiB/s."""


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a network link.

    Attributes:
        latency_s: one-way propagation delay, seconds (>= 0).
        bandwidth_bytes_per_s: transmission rate, bytes per second (> 0).
    """

    latency_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.latency_s) or self.latency_s < 0:
            raise ValueError(f"Link latency is {self.latency_s!r} s; expected a finite number >= 0.")
        if not math.isfinite(self.bandwidth_bytes_per_s) or self.bandwidth_bytes_per_s <= 0:
            raise ValueError(
                f"Link bandwidth is {self.bandwidth_bytes_per_s!r} bytes/s; expected a finite number > 0."
            )

    def transfer_time(self, nbytes: int) -> float:
        """Seconds to send ``nbytes`` over an idle link: ``latency + nbytes / bandwidth``."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


class TopologyError(ValueError):
    """A locations table or a location name is invalid (the message names the value and what is expected)."""


@dataclass(frozen=True)
class LocationTable:
    """Symmetric link table between named locations.

    Attributes:
        links: ``{frozenset({a, b}): LinkSpec}`` for each listed unordered pair of distinct locations.
        default: link for pairs not listed and for same-location pairs.
        default_geo: the default geo-distributed set; node ``i`` sits at ``default_geo[i % len]``.
    """

    links: dict[frozenset[str], LinkSpec]
    default: LinkSpec
    default_geo: tuple[str, ...]
    names: frozenset[str] = field(default_factory=frozenset)

    def link(self, loc_a: str, loc_b: str) -> LinkSpec:
        """The link between two locations (order does not matter); the default for unknown or equal names."""
        if loc_a == loc_b:
            return self.default
        return self.links.get(frozenset((loc_a, loc_b)), self.default)


def location_of(node_id: int, locations: list[str] | tuple[str, ...]) -> str:
    """Location of node ``node_id``: ``locations[node_id % len(locations)]`` (docs/paper.md §8).

    Raises:
        TopologyError: if ``locations`` is empty or ``node_id`` is negative.
    """
    if not locations:
        raise TopologyError("The location list is empty; expected at least one location name.")
    if node_id < 0:
        raise TopologyError(f"Node id {node_id} is negative; expected a node id >= 0.")
    return locations[node_id % len(locations)]


def _number(value: object, what: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TopologyError(f"{what} is {value!r}; expected a finite number.")
    if value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise TopologyError(f"{what} is {value!r}; expected a number {bound}.")
    return float(value)


def _spec(entry: object, where: str) -> LinkSpec:
    if not isinstance(entry, dict):
        raise TopologyError(f"{where} is {entry!r}; expected an object with latency_ms and bandwidth_gib_s.")
    for key in ("latency_ms", "bandwidth_gib_s"):
        if key not in entry:
            raise TopologyError(f"{where} has no '{key}'; expected latency_ms and bandwidth_gib_s.")
    latency_ms = _number(entry["latency_ms"], f"{where} latency_ms", positive=False)
    bandwidth = _number(entry["bandwidth_gib_s"], f"{where} bandwidth_gib_s", positive=True)
    return LinkSpec(latency_s=latency_ms / 1000.0, bandwidth_bytes_per_s=bandwidth * GIB)


def parse_locations(doc: object, source: str = "<locations>") -> LocationTable:
    """Validate a parsed locations document (the JSON format of ``locations.json``) into a table.

    Raises:
        TopologyError: on a missing key, a negative latency, a non-positive bandwidth, a duplicate pair,
            a self-pair, or a default_geo name that no link mentions.
    """
    if not isinstance(doc, dict):
        raise TopologyError(f"{source}: the document is a {type(doc).__name__}; expected a JSON object.")
    for key in ("default", "default_geo", "links"):
        if key not in doc:
            raise TopologyError(f"{source}: missing key '{key}'; expected default, default_geo and links.")
    default = _spec(doc["default"], f"{source}: default")
    if not isinstance(doc["links"], list):
        raise TopologyError(f"{source}: links is {type(doc['links']).__name__}; expected a list.")
    links: dict[frozenset[str], LinkSpec] = {}
    for i, entry in enumerate(doc["links"]):
        where = f"{source}: links[{i}]"
        a, b = (entry.get("a"), entry.get("b")) if isinstance(entry, dict) else (None, None)
        if not isinstance(a, str) or not isinstance(b, str) or not a or not b:
            raise TopologyError(f"{where} has a={a!r}, b={b!r}; expected two non-empty location names.")
        if a == b:
            raise TopologyError(f"{where} links {a!r} to itself; same-location pairs use the default.")
        pair = frozenset((a, b))
        if pair in links:
            raise TopologyError(f"{where} repeats the pair {a}-{b}; expected one entry per unordered pair.")
        links[pair] = _spec(entry, where)
    names = frozenset(name for pair in links for name in pair)
    geo = doc["default_geo"]
    if not isinstance(geo, list) or not geo or not all(isinstance(g, str) for g in geo):
        raise TopologyError(f"{source}: default_geo is {geo!r}; expected a non-empty list of names.")
    for name in geo:
        if name not in names:
            raise TopologyError(
                f"{source}: default_geo names unknown location {name!r}; expected one of {sorted(names)}."
            )
    return LocationTable(links=links, default=default, default_geo=tuple(geo), names=names)


def load_locations(path: str | Path | None = None) -> LocationTable:
    """Load and validate a locations table; ``None`` loads the table shipped with the package.

    Raises:
        TopologyError: if the file is missing, is not valid JSON, or fails validation.
    """
    if path is None:
        source = "checkfree/swarm/locations.json"
        text = resources.files("checkfree.swarm").joinpath("locations.json").read_text(encoding="utf-8")
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TopologyError(
                f"{source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
            ) from None
        return parse_locations(doc, source)
    source = str(path)
    try:
        doc = read_mapping(path, "locations file")
    except ConfigFileError as exc:
        raise TopologyError(str(exc)) from None
    except OSError as exc:
        raise TopologyError(f"Cannot read locations file {source}: {exc.strerror}.") from None
    return parse_locations(doc, source)
