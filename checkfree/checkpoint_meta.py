"""A checkpoint's name, its listing and its verified meta.json (checkfree.checkpointing's layout).

A sha256 proves that meta.json holds the bytes that were written, not that every field has the type a restore
needs: a hand-edited, re-checksummed or foreign meta.json with ``"iteration": null`` would otherwise fail deep
inside a resume with a traceback.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

FORMAT = "checkfree-universal-v2"
META_SUM = "meta.sha256"
_DIR_RE = re.compile(r"^iter_(\d{7,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, truncated, corrupt or does not fit the model; one sentence says which."""


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


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest (lowest effective iteration) first; temporaries ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path, sum_path = path / "meta.json", path / META_SUM
    if not meta_path.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no meta.json; expected a directory written by checkfree "
            "(an interrupted save never leaves one under its final name)."
        )
    raw = meta_path.read_bytes()
    if not sum_path.is_file():
        raise CheckpointError(f"checkpoint file {sum_path} is missing; the metadata cannot be verified.")
    if hashlib.sha256(raw).hexdigest() != sum_path.read_text().strip():
        raise CheckpointError(
            f"checkpoint file {meta_path} fails its sha256 check ({sum_path}): it is corrupt."
        )
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"checkpoint file {meta_path} is not valid JSON: it is corrupt.") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else None
        raise CheckpointError(f"checkpoint {path} has format {got!r}; expected {FORMAT!r}.")
    missing = [
        k
        for k in ("iteration", "effective_iteration", "n_stages", "n_layers_per_stage", "files")
        if k not in meta
    ]
    if missing:
        raise CheckpointError(f"checkpoint file {meta_path} lacks the keys {missing}: it is corrupt.")
    problem = meta_type_problem(meta)
    if problem:
        raise CheckpointError(f"checkpoint file {meta_path} has {problem}.")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """meta.json of a checkpoint directory, verified against meta.sha256 and type-checked (no tensor is read).

    Raises:
        CheckpointError: the directory does not exist (the message lists the checkpoints next to it), or its
            meta.json is missing, corrupt or has a field of the wrong type.
    """
    path = Path(path)
    if not path.is_dir():
        siblings = [p.name for p in list_checkpoints(path.parent)]
        listing = ", ".join(siblings) if siblings else f"none under {path.parent}"
        raise CheckpointError(f"checkpoint {path} does not exist; existing checkpoints: {listing}.")
    inside = list_checkpoints(path / "checkpoints")
    if inside and not (path / "meta.json").exists():
        names = ", ".join(str(p) for p in inside)
        raise CheckpointError(
            f"{path} is a run directory, not a checkpoint; expected one of its checkpoints: {names}."
        )
    return _read_meta(path)
