"""The swarm's WAN table, ``checkfree/swarm/locations.json`` or a swarm config's ``locations_file``: one-way
latency (ms) and bandwidth (GiB/s) per unordered pair of locations (docs/paper.md §8), read by
checkfree.swarm.topology. The format is checkfree's own, so unknown keys are refused at every level.

What a schema cannot say (a link from a location to itself, an unordered pair given twice, a ``default_geo``
name that no link mentions) is checked by checkfree.swarm.topology.parse_locations.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from checkfree.schemas.fields import MAX_NAME, MAX_SWARM_NODES, name, number

MAX_LATENCY_MS = 60_000.0
"""Longest one-way latency of a link, in milliseconds (a minute; the paper's longest is 138 ms)."""
MAX_BANDWIDTH_GIB_S = 1_000.0
"""Largest bandwidth of a link, in GiB/s (the paper's largest is 0.5)."""
MAX_LINKS = 10_000
"""Most links in a table (every pair of 141 locations; the paper's table has 66)."""
MAX_GEO = MAX_SWARM_NODES
"""Most names in ``default_geo`` (one per node of the largest swarm)."""

LatencyMs = number(0.0, MAX_LATENCY_MS)
BandwidthGibS = number(0.0, MAX_BANDWIDTH_GIB_S, above=True)
LEAVES = {
    "latency_ms": f"a finite number ≥ 0 and ≤ {MAX_LATENCY_MS:,g} (milliseconds)",
    "bandwidth_gib_s": f"a positive number ≤ {MAX_BANDWIDTH_GIB_S:,g} (GiB/s)",
    "a": f"a location name of 1 to {MAX_NAME:,} characters",
    "b": f"a location name of 1 to {MAX_NAME:,} characters",
}
"""What each field inside ``default`` and ``links`` expects, as the error sentence says it."""


class Link(BaseModel):
    """The link used for pairs not listed and same-location pairs (``default``)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    latency_ms: LatencyMs
    bandwidth_gib_s: BandwidthGibS


class PairLink(Link):
    """One entry of ``links``: the link between locations ``a`` and ``b`` (either direction)."""

    a: name()
    b: name()


class LocationsFile(BaseModel):
    """A locations table."""

    model_config = ConfigDict(strict=True, extra="forbid")
    description: Annotated[
        StrictStr | None,
        Field(max_length=MAX_NAME, description=f"a string of at most {MAX_NAME:,} characters"),
    ] = None
    default: Annotated[Link, Field(description="an object with latency_ms and bandwidth_gib_s")]
    default_geo: Annotated[
        list[name()],
        Field(
            min_length=1,
            max_length=MAX_GEO,
            description=f"a list of 1 to {MAX_GEO:,} location names (each 1 to {MAX_NAME:,} characters)",
        ),
    ]
    links: Annotated[
        list[PairLink],
        Field(
            max_length=MAX_LINKS,
            description=f"a list of at most {MAX_LINKS:,} objects with a, b, latency_ms and bandwidth_gib_s",
        ),
    ]


KNOWN = {
    "default": sorted(Link.model_fields),
    "links": sorted(PairLink.model_fields),
}
"""The keys an unknown key inside ``default`` or a link is told apart from."""
