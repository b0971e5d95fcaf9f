"""One colour per strategy and recovery rule, the same in every plot (report and probe)."""

from __future__ import annotations

COLOURS: dict[str, str] = {
    "no_failure": "black",
    "random": "tab:red",
    "copy": "tab:orange",
    "zero": "tab:brown",
    "average": "tab:olive",
    "checkfree": "tab:green",
    "checkfree_plus": "tab:blue",
    "checkpoint": "tab:purple",
    "one": "tab:pink",
    "redundant": "tab:gray",
    "ec_snapshot": "tab:cyan",
    "ladder": "navy",
    # recovery rules that are not strategy names (the recoveries plot colours rules)
    "rollback": "tab:purple",
    "replica": "tab:gray",
    "restore_one": "tab:pink",
    "ec_decode": "tab:cyan",
    "stage0_copy": "tab:blue",
}
"""Fixed colours; a strategy and the rule it is named after share one."""

SPARE_COLOURS = ("gold", "teal", "crimson", "lime", "indigo", "sienna", "magenta", "darkkhaki")


def colour(name: str) -> str | None:
    """The fixed colour of a strategy or rule; a label's first word counts ("no_failure +swaps" is no_failure)."""
    return COLOURS.get(name.split(" ")[0])


def colours(names: list[str]) -> dict[str, str]:
    """A distinct colour per name: its fixed colour (see :func:`colour`) unless an earlier name took it, else the
    next spare colour no other name uses."""
    chosen: dict[str, str] = {}
    for name in names:
        fixed = colour(name)
        if fixed is not None and fixed not in chosen.values():
            chosen[name] = fixed
    spare = [c for c in SPARE_COLOURS if c not in chosen.values()]
    for i, name in enumerate(n for n in names if n not in chosen):
        chosen[name] = spare[i % len(spare)]
    return chosen
