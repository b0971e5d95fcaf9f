"""Types of a checkpoint's meta.json fields (checkfree.checkpointing's layout).

A sha256 proves that meta.json holds the bytes that were written, not that every field has the type a restore
needs: a hand-edited, re-checksummed or foreign meta.json with ``"iteration": null`` would otherwise fail deep
inside a resume with a traceback.
"""

from __future__ import annotations

from typing import Any


def _is_count(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _is_number_list(value: Any, length: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == length
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def meta_type_problem(meta: dict[str, Any]) -> str | None:
    """None when every field a restore reads has its type; else "'<key>' = <value>; expected <type>"."""

    def bad(key: str, expected: str) -> str:
        return f"{key!r} = {meta.get(key)!r}; expected {expected}"

    for key in ("iteration", "effective_iteration"):
        if not _is_count(meta[key], 0):
            return bad(key, "an integer >= 0")
    for key in ("n_stages", "n_layers_per_stage"):
        if not _is_count(meta[key], 1):
            return bad(key, "a positive integer")
    files = meta["files"]
    if not isinstance(files, dict) or not all(
        isinstance(info, dict) and isinstance(info.get("sha256"), str) and _is_count(info.get("bytes"), 0)
        for info in files.values()
    ):
        return bad("files", 'an object {"<file>": {"sha256": str, "bytes": int}}')
    for key in ("lr_multipliers", "grad_norms"):
        if key in meta and not _is_number_list(meta[key], meta["n_stages"] + 1):
            return bad(key, f"a list of {meta['n_stages'] + 1} numbers (one per stage)")
    if "config" in meta and not isinstance(meta["config"], dict):
        return bad("config", "an object")
    if "data" in meta and not isinstance(meta["data"], dict | None):
        return bad("data", "an object")
    return None
