"""Run and output directories that each hold exactly one run or one output (docs/simulator.md, Outputs).

A run directory is written by one run only. Deciding whether a directory may be used has no side effect
(:func:`plan_run_dir`, :func:`check_output_dir`), so a command validates everything first and touches the disk
only afterwards (:func:`apply_run_dir`, :func:`claim_output_dir`):

- a fresh run into a directory that holds anything refuses, unless ``--overwrite``, which moves the old run aside
  to ``DIR.replaced-<UTC timestamp>`` (never deletes it);
- a resumed run may write into the run directory that holds its checkpoint (it appends to metrics.jsonl);
- ``export --out`` and ``report --out`` write into a new or empty directory, or into their own previous output,
  recognised by its marker file; never into a run directory or another non-empty directory;
- a path that is a file (or lies under a file) is refused wherever a directory is expected, and so is one that
  cannot be written (its nearest existing directory refuses a new entry).
"""

from __future__ import annotations

import datetime
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree import jsonio

log = logging.getLogger(__name__)


class DirectoryConflictError(ValueError):
    """A directory cannot be used as asked; the message is one sentence naming it and the way out."""


def check_writable(path: Path, option: str) -> None:
    """Refuse ``path`` when its nearest existing directory cannot take a new entry (read-only, no permission).

    The check creates and removes an empty probe directory there (``os.access`` alone says yes to root on a
    read-only location such as /proc), so nothing is left behind.

    Raises:
        DirectoryConflictError: one sentence naming ``path`` and the directory that refused.
    """
    path = Path(path)
    base = next((p for p in (path, *path.parents) if p.is_dir()), Path("."))
    error: str | None = None
    if not os.access(base, os.W_OK | os.X_OK):
        error = "permission denied"
    else:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".checkfree-write-check-", dir=base))
        except OSError as err:
            error = err.strerror or type(err).__name__
    if error is not None:
        where = "" if base == path else f" (its nearest existing directory {base})"
        raise DirectoryConflictError(
            f"{option} {path} cannot be written{where}: {error}; expected a location you can write to."
        )


def check_directory_path(path: Path, option: str, writable: bool = True) -> None:
    """Refuse a path that is a file, or lies under a file, where a directory is expected; and, with
    ``writable``, one that cannot be written (:func:`check_writable`).

    Raises:
        DirectoryConflictError: ``path`` or one of its ancestors exists and is not a directory, or it cannot be
            written.
    """
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                where = "is a file" if p == path else f"lies under {p}, which is a file"
                raise DirectoryConflictError(
                    f"{option} {path} {where}; expected a directory (or a new path)."
                )
            break
    if writable:
        check_writable(path, option)


def _is_empty_dir(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and next(path.iterdir(), None) is None)


def holds_something(path: Path) -> bool:
    """Whether ``path`` is a directory with at least one entry (a run, an output, or anything else)."""
    return not _is_empty_dir(Path(path))


def _inside(child: Path, parent: Path) -> bool:
    try:
        Path(child).resolve().relative_to(Path(parent).resolve())
        return True
    except ValueError:
        return False


def replaced_name(path: Path, now: datetime.datetime | None = None) -> Path:
    """``DIR.replaced-<UTC timestamp>`` (with ``-2``, ``-3``… if that exists too): where --overwrite moves a run."""
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    base = Path(path)
    candidate, n = base.with_name(f"{base.name}.replaced-{stamp}"), 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}.replaced-{stamp}-{n}")
    return candidate


@dataclass(frozen=True)
class RunDirPlan:
    """What :func:`apply_run_dir` will do: create ``path``, after moving an old run to ``move_to`` if set."""

    path: Path
    move_to: Path | None = None


def plan_run_dir(
    path: Path,
    *,
    resume_from: Path | None = None,
    overwrite: bool = False,
    option: str = "--run-dir",
) -> RunDirPlan:
    """Decide, without touching the disk, whether a run may write into ``path``.

    Allowed: a new or empty directory; the run directory that holds ``resume_from`` (a resumed run appends);
    any other directory only with ``overwrite`` (the old content is moved aside, see :func:`replaced_name`).

    Raises:
        DirectoryConflictError: ``path`` is a file, or holds another run and ``overwrite`` is False.
    """
    path = Path(path)
    check_directory_path(path, option)
    if not holds_something(path):
        return RunDirPlan(path)
    if resume_from is not None and _inside(resume_from, path):
        return RunDirPlan(path)
    if overwrite:
        return RunDirPlan(path, replaced_name(path))
    raise DirectoryConflictError(
        f"{option} {path} already holds a run (or other files); pass {option} with a new directory, or "
        f"--overwrite to move the old one aside to {path}.replaced-<timestamp>."
    )


def apply_run_dir(plan: RunDirPlan) -> Path:
    """Carry out a :class:`RunDirPlan`: move the old run aside (never delete it), create the directory."""
    if plan.move_to is not None:
        os.rename(plan.path, plan.move_to)
        log.warning("--overwrite: moved the old run %s aside to %s", plan.path, plan.move_to)
    plan.path.mkdir(parents=True, exist_ok=True)
    return plan.path


def check_output_dir(out: Path, marker: str, what: str, option: str = "--out") -> None:
    """Refuse an output directory that is a file, or non-empty without ``marker`` (not our own earlier output).

    Raises:
        DirectoryConflictError: with one sentence naming ``out`` and what is expected.
    """
    out = Path(out)
    check_directory_path(out, option)
    if holds_something(out) and not (out / marker).is_file():
        raise DirectoryConflictError(
            f"{option} {out} is a non-empty directory without {marker}, so it is not an earlier {what}; "
            "expected a new or empty directory (or an earlier output of the same command)."
        )


def claim_output_dir(out: Path, marker: str, content: dict[str, Any]) -> None:
    """Create ``out`` and write its marker first, so an interrupted write can still be replaced later."""
    out.mkdir(parents=True, exist_ok=True)
    (out / marker).write_text(jsonio.dumps(content, indent=1, default=str))
