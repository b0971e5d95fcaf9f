"""The probe's cells on disk: ``cells.jsonl`` (one JSON line per finished cell), what a probe resumes from.

A cell is appended, with an fsync, the moment it finishes, so a killed probe loses at most the cell it was in.
Several processes may share one output directory (``probe --shard K/N``): each appends only its own cells, the
first to start claims the directory, and the last to finish writes the report. :func:`locked` serialises those
two steps (an exclusive ``flock`` on the directory itself, released by the kernel if the process dies).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "checkfree_probe.json"
"""Marks a directory as a probe's output, which a later probe may resume or replace (checkfree.rundir)."""
CELLS = "cells.jsonl"
"""One JSON line per finished cell, written as it finishes: what a rerun resumes from."""

CellKey = tuple[int | None, str, int, bool]
"""(stage or None for a reference, strategy, seed, swaps): one cell of the probe, and its resume key."""


@dataclass
class Cell:
    """One (stage, strategy, seed): validation loss after each step count, and the weight distances."""

    stage: int | None
    strategy: str
    seed: int
    losses: dict[int, float]
    rule: str = ""
    weight_rel_l2: float | None = None
    weight_cosine: float | None = None
    swaps: bool = False
    """Trained with CheckFree+ swaps after the failure (a swap strategy, or the swapped no_failure reference)."""

    @property
    def key(self) -> CellKey:
        return (self.stage, self.strategy, self.seed, self.swaps)


def cell_json(cell: Cell) -> dict[str, Any]:
    """The JSON form of a cell (step counts as string keys), as in cells.jsonl and probe.json."""
    return cell.__dict__ | {"losses": {str(k): v for k, v in cell.losses.items()}}


def cell_from_json(line: str) -> Cell | None:
    """A cell from one line of cells.jsonl; None for a line cut short by a kill or not a cell."""
    try:
        d = json.loads(line)
        cell = Cell(
            d["stage"],
            d["strategy"],
            int(d["seed"]),
            {int(k): float(v) for k, v in d["losses"].items()},
            d.get("rule", ""),
            d.get("weight_rel_l2"),
            d.get("weight_cosine"),
            bool(d.get("swaps", False)),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    if cell.stage is not None and not isinstance(cell.stage, int):
        return None
    return cell


def same_identity(out: Path, identity: dict[str, Any]) -> bool:
    """Whether ``out`` holds a probe of the same checkpoint and step counts (``identity``), so its cells count."""
    try:
        return json.loads((out / MARKER).read_text()).get("identity") == identity
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def finished_cells(out: Path, identity: dict[str, Any]) -> dict[CellKey, Cell]:
    """The cells a probe into ``out`` finished for the same ``identity`` (checkpoint and step counts).

    An earlier probe of another checkpoint or other step counts is not resumed: none of its cells is returned.
    """
    cells_file = out / CELLS
    if not cells_file.is_file() or not same_identity(out, identity):
        return {}
    found: dict[CellKey, Cell] = {}
    for line in cells_file.read_text().splitlines():
        cell = cell_from_json(line)
        if cell is not None:
            found[cell.key] = cell
    return found


def append_cell(out: Path, cell: Cell) -> None:
    """Append one finished cell to cells.jsonl and fsync it (one write: concurrent shards never interleave).

    A line cut short by a kill is ended first, so the new cell is not glued onto it.
    """
    line = json.dumps(cell_json(cell)) + "\n"
    with open(out / CELLS, "ab+") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def locked(out: Path, timeout_s: float = 60.0) -> Iterator[None]:
    """Hold an exclusive lock on the directory ``out`` (which must exist) for the duration of the block.

    Holders only read and write a few small files, so waiting ``timeout_s`` means something is wrong.

    Raises:
        TimeoutError: another process held the lock for ``timeout_s`` seconds.
    """
    fd = os.open(out, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{out} stayed locked by another probe for {timeout_s:.0f} s"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
