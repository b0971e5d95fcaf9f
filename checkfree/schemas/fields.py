"""Bounded field types shared by the schemas: integers that are real integers (never a bool, never 1e29 as a
float), finite floats, short strings, and the maxima checkfree accepts (each named once here and in docs).

Each type carries a ``description`` ("a positive integer ≤ 1,024"): checkfree.schemas.errors says it as what was
expected when a value falls outside.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictFloat, StrictInt, StrictStr

MAX_STAGES = 1024
"""Transformer stages S of a model or swarm (the paper's largest is 8)."""
MAX_REPLICAS = 1024
"""Replicas per stage of a swarm (the paper's largest is 3)."""
MAX_NODES = 1_000_000
"""Node ids (a swarm's nodes, replacements and ``--machines`` ranges) lie below this."""
MAX_SWARM_NODES = 4096
"""Nodes (S + 1) · R of a swarm's initial topology (the paper's largest is 8 · 3)."""
MAX_MICROBATCHES = 4096
"""Microbatches per iteration (the paper's largest is 16)."""
MAX_ITERATIONS = 100_000_000
"""Iterations of a run, and every interval counted in iterations (the paper's longest run is 100,001)."""
MAX_SECONDS = 1e7
"""Longest timeout or interval, in seconds (about 116 days)."""
MAX_NAME = 4096
"""Longest string (a name, a path)."""
MAX_ITEMS = 100_000
"""Longest list in a file checkfree reads."""


def count(low: int, high: int, words: str | None = None) -> Any:
    """An integer in [low, high] (strict: a bool or a float is refused); ``words`` says the range in messages."""
    if words is None:
        words = f"a positive integer ≤ {high:,}" if low == 1 else f"an integer in [{low:,}, {high:,}]"
    return Annotated[StrictInt, Field(ge=low, le=high, description=words)]


def number(low: float = 0.0, high: float = 1e300, above: bool = False) -> Any:
    """A finite number in [low, high] (or (low, high] when ``above``); an integer is taken as a float."""
    bound = {"gt": low} if above else {"ge": low}
    if above and low == 0:
        words = f"a positive number ≤ {high:g}"
    else:
        words = f"a finite number {'>' if above else '≥'} {low:g} and ≤ {high:g}"
    return Annotated[StrictFloat, Field(**bound, le=high, allow_inf_nan=False, description=words)]


def name(what: str = "a non-empty string") -> Any:
    """A non-empty string of at most :data:`MAX_NAME` characters."""
    return Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME, description=what)]


def names(most: int) -> Any:
    """A list of at most ``most`` non-empty strings."""
    return Annotated[list[name()], Field(max_length=most, description=f"a list of at most {most:,} names")]


def describe(schema: Any) -> str:
    """What ``schema`` (a type of this module, optionally ``| None``) expects, in words."""
    args = [a for a in getattr(schema, "__args__", ()) if a is not type(None)]
    if not hasattr(schema, "__metadata__") and len(args) == 1:
        return f"{describe(args[0])}, or null"
    infos = [m for m in getattr(schema, "__metadata__", ()) if getattr(m, "description", None)]
    return infos[-1].description if infos else "another value"
