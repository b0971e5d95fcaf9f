"""The WAN topology of the swarm: a table of links between locations, and which node sits where.

The table (docs/paper.md §8, measured by the CheckFree authors on Google Cloud) gives a one-way latency in
milliseconds and a bandwidth in GiB/s for each unordered pair of locations. Pairs not in the table and
same-location pairs use the table's default (10 ms, 0.5 GiB/s, as in the authors' trainer).

The canonical data file is ``checkfree/swarm/locations.json`` (shipped inside the package and read with
``importlib.resources`` so the library works from any directory); ``communication/locations.json`` is a
copy for the launchers, kept byte-equal by ``tests/swarm/wire/test_netem.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from checkfree.config_files import ConfigFileError, read_mapping
from checkfree.schemas.errors import descriptions_of, sentence
from checkfree.schemas.limits import parse_json
from checkfree.schemas.locations import KNOWN, LEAVES, Link, LocationsFile

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


def _sentence(exc: ValidationError, source: str) -> str:
    """The schema's first complaint as one sentence; an unknown key is told apart from its own object's keys."""
    loc = exc.errors(include_url=False)[0]["loc"]
    known = KNOWN.get(str(loc[0])) if len(loc) > 1 else None
    known = known or list(LocationsFile.model_fields)
    return sentence(exc, source, descriptions_of(LocationsFile), known, LEAVES)


def _spec(link: Link) -> LinkSpec:
    return LinkSpec(latency_s=link.latency_ms / 1000.0, bandwidth_bytes_per_s=link.bandwidth_gib_s * GIB)


def parse_locations(doc: object, source: str = "<locations>") -> LocationTable:
    """Validate a parsed locations document (the JSON format of ``locations.json``) into a table.

    The schema is checkfree.schemas.locations.LocationsFile (unknown keys refused at every level; latency in
    [0, 60,000] ms, bandwidth in (0, 1,000] GiB/s, finite); this adds what a schema cannot say.

    Raises:
        TopologyError: on a schema violation (one sentence: file, field, value, what was expected), a duplicate
            pair, a self-pair, or a default_geo name that no link mentions.
    """
    if not isinstance(doc, dict):
        raise TopologyError(f"{source}: the document is a {type(doc).__name__}; expected a JSON object.")
    try:
        table = LocationsFile.model_validate(doc)
    except ValidationError as exc:
        raise TopologyError(_sentence(exc, source)) from None
    links: dict[frozenset[str], LinkSpec] = {}
    for i, entry in enumerate(table.links):
        where = f"{source}: links[{i}]"
        a, b = entry.a, entry.b
        if a == b:
            raise TopologyError(f"{where} links {a!r} to itself; same-location pairs use the default.")
        pair = frozenset((a, b))
        if pair in links:
            raise TopologyError(f"{where} repeats the pair {a}-{b}; expected one entry per unordered pair.")
        links[pair] = _spec(entry)
    names = frozenset(name for pair in links for name in pair)
    for name in table.default_geo:
        if name not in names:
            raise TopologyError(
                f"{source}: default_geo names unknown location {name!r}; expected one of {sorted(names)}."
            )
    return LocationTable(
        links=links, default=_spec(table.default), default_geo=tuple(table.default_geo), names=names
    )


def load_locations(path: str | Path | None = None) -> LocationTable:
    """Load and validate a locations table; ``None`` loads the table shipped with the package.

    A file is read as every config is (checkfree.config_files.read_mapping: JSON or YAML, at most 1 MiB, nested
    at most 32 deep) and checked by :func:`parse_locations`.

    Raises:
        TopologyError: if the file is missing, too large or deep, not valid JSON/YAML, or fails validation.
    """
    if path is None:
        source = "checkfree/swarm/locations.json"
        text = resources.files("checkfree.swarm").joinpath("locations.json").read_text(encoding="utf-8")
        try:
            doc = parse_json(text, source)
        except ValueError as exc:  # InputLimitError (too deep) is one too
            raise TopologyError(str(exc)) from None
        return parse_locations(doc, source)
    source = str(path)
    try:
        doc = read_mapping(path, "locations file")
    except ConfigFileError as exc:
        raise TopologyError(str(exc)) from None
    except OSError as exc:
        raise TopologyError(f"Cannot read locations file {source}: {exc.strerror}.") from None
    return parse_locations(doc, source)
