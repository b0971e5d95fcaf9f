"""The checkpoint writer of the checkpoint baselines: ``sync``, ``async`` (DataStates-LLM) or ``memory`` (Gemini).

One writer takes whole-model :class:`~checkfree.checkpoint.store.Snapshot` s and keeps the newest *committed* one:

- ``sync``: copy and write to disk while training waits (the stall is the whole save).
- ``async``: DataStates-LLM's lazy snapshot. Parameters and Adam state do not change between an iteration's start
  and its optimizer step, so the copy runs on a background thread while forward/backward run; the trainer waits
  for it (if at all) just before the optimizer step, so a snapshot never sees a half-updated state. The copy is
  then flushed to disk on a background thread; at most one flush is in flight (a new save first waits for it).
- ``memory``: the snapshot stays in RAM (Gemini keeps it in peer CPU memory); captured like ``async``, no disk.

Stall = seconds the training thread was blocked by saving. Saves are deterministic: a rollback always uses the
newest save started (it waits for an unfinished flush; that wait is counted as recovery time, not stall).
Only rank 0 writes to disk; every rank reads the same directory on a rollback (single-machine simulator).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree.checkpoint import store
from checkfree.checkpoint.store import Snapshot
from checkfree.config import SAVE_MODES

log = logging.getLogger(__name__)


@dataclass
class _Save:
    snapshot: Snapshot | None
    iteration: int
    effective: int
    bytes: int
    started: float
    stall: float
    capture: Future | None = None
    flush: Future | None = None
    path: Path | None = None


class SnapshotWriter:
    """Saves snapshots in ``mode`` under ``root`` (disk modes) and writes one "checkpoint" line per save through
    ``emit`` when the save commits (always on the calling thread: a background save commits at the next call).

    Args:
        mode: "sync" | "async" | "memory".
        root: checkpoint directory for the disk modes (the universal format, loadable with ``--resume-from``);
            None: a temporary directory, deleted by :meth:`close` (library use without a run directory).
        keep: checkpoints kept on disk.
        emit: writes one metrics line, ``emit(kind, **fields)`` (the strategy's run context,
            :meth:`checkfree.recovery.base.StrategyContext.emit`).
        writes: False on ranks that do not write to disk (they skip disk-mode captures entirely).

    Raises:
        ValueError: unknown mode.
    """

    def __init__(
        self, mode: str, root: Path | None, keep: int, emit: Callable[..., None], writes: bool = True
    ):
        if mode not in SAVE_MODES:
            raise ValueError(f"save mode {mode!r} is unknown; expected one of {list(SAVE_MODES)}.")
        self._tmp: tempfile.TemporaryDirectory | None = None
        if mode != "memory" and root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="checkfree-checkpoints-")
            root = Path(self._tmp.name)
            log.warning(
                "save mode %s without a checkpoint directory: writing to %s (deleted at the end)", mode, root
            )
        self.mode, self.root, self.keep, self.emit, self.writes = mode, root, max(1, keep), emit, writes
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="checkpoint")
        self._pending: _Save | None = None  # capture or flush in flight
        self.latest: Snapshot | Path | None = None  # newest committed save (in memory or on disk)
        self.latest_effective: int | None = None
        self.saves = 0
        self.stall_seconds = 0.0
        self.save_seconds = 0.0
        self.save_bytes = 0
        self.held_bytes = 0  # snapshot bytes held in RAM between saves
        self.peak_bytes = 0

    @property
    def local(self) -> bool:
        """Whether this rank keeps or writes snapshots at all."""
        return self.mode == "memory" or self.writes

    # ------------------------------------------------------------------ saving
    def start(self, snapshot: Snapshot, defer: bool) -> None:
        """Begin a save of a by-reference ``snapshot`` (``capture(..., copy=False)``) taken at an iteration start.

        ``defer``: the copy may run in the background until :meth:`end_capture` (nothing changes the state
        before then); False when a failure is about to destroy stages, so the copy is made now.
        """
        t0 = time.perf_counter()
        self.wait()  # at most one save (capture or flush) in flight
        if not self.local:  # another rank writes this checkpoint; remember where it will be
            self.latest = self.root / store.checkpoint_name(snapshot.effective_iteration)
            self.latest_effective = snapshot.effective_iteration
            return
        save = _Save(snapshot, snapshot.iteration, snapshot.effective_iteration, snapshot.nbytes, t0, 0.0)
        self._note_held(save.bytes)
        if self.mode == "sync":
            store.materialize(snapshot)
            save.path = store.write_snapshot(snapshot, self.root, self.keep)
            self._commit(save, stall=time.perf_counter() - t0)
            return
        if defer:
            save.capture = self._pool.submit(store.materialize, snapshot)
            save.stall = time.perf_counter() - t0
            self._pending = save
        else:
            store.materialize(snapshot)
            save.stall = time.perf_counter() - t0
            self._pending = save
            self._after_capture()

    def end_capture(self) -> None:
        """Wait for a background copy (called before the optimizer step), then flush (async) or commit (memory)."""
        save = self._pending
        if save is None or save.capture is None:
            return
        t0 = time.perf_counter()
        save.capture.result()
        save.capture = None
        save.stall += time.perf_counter() - t0
        self._after_capture()

    def _after_capture(self) -> None:
        save = self._pending
        if self.mode == "memory":
            self._pending = None
            self._commit(save, stall=save.stall)
        else:
            save.flush = self._pool.submit(store.write_snapshot, save.snapshot, self.root, self.keep)

    def poll(self) -> None:
        """Commit a finished background flush (writes its metrics line from the training thread)."""
        save = self._pending
        if save is not None and save.flush is not None and save.flush.done():
            self._finish_flush()

    def wait(self) -> None:
        """Block until no save is in flight (the time is counted as stall by the caller's measurement)."""
        save = self._pending
        if save is None:
            return
        if save.capture is not None:
            self.end_capture()
        if self._pending is not None and self._pending.flush is not None:
            self._finish_flush()

    def _finish_flush(self) -> None:
        save = self._pending
        save.path = save.flush.result()  # re-raises a failed write
        save.flush = None
        self._pending = None
        save.snapshot = None  # the RAM copy is released once it is on disk
        self._commit(save, stall=save.stall)

    def _commit(self, save: _Save, stall: float) -> None:
        seconds = time.perf_counter() - save.started
        if self.mode == "memory":
            self.latest, self.held_bytes = save.snapshot, save.bytes
        else:
            self.latest, self.held_bytes = save.path, 0
        self.latest_effective = save.effective
        self.saves += 1
        self.stall_seconds += stall
        self.save_seconds += seconds
        self.save_bytes += save.bytes
        self.emit(
            "checkpoint",
            iteration=save.iteration,
            effective_iteration=save.effective,
            path=None if save.path is None else str(save.path),
            bytes=save.bytes,
            seconds=round(seconds, 6),
            stall_seconds=round(stall, 6),
            mode=self.mode,
            purpose="strategy",
        )
        log.debug(
            "checkpoint at effective iteration %d committed (%s, stall %.4f s)",
            self.latest_effective,
            self.mode,
            stall,
        )

    def _note_held(self, new_bytes: int) -> None:
        self.peak_bytes = max(self.peak_bytes, self.held_bytes + new_bytes)

    # ------------------------------------------------------------------ loading
    def load_latest(self) -> Snapshot:
        """The newest committed snapshot (waits for an unfinished save; disk modes read and verify it).

        Raises:
            RuntimeError: nothing was ever saved.
            CheckpointError: the checkpoint on disk is corrupt.
        """
        self.wait()
        if self.latest is None:
            raise RuntimeError(
                "no checkpoint has been taken yet; the strategy takes one at its first iteration."
            )
        if isinstance(self.latest, Snapshot):
            return self.latest
        return store.read_checkpoint(self.latest)

    def close(self) -> None:
        """Finish any save in flight and stop the background threads."""
        self.wait()
        self._pool.shutdown(wait=True)
        if self._tmp is not None:
            self._tmp.cleanup()

    def stats(self) -> dict[str, Any]:
        """Save costs for summary.json."""
        return {
            "save_mode": self.mode,
            "saves": self.saves,
            "save_stall_seconds": round(self.stall_seconds, 6),
            "save_seconds": round(self.save_seconds, 6),
            "save_bytes": self.save_bytes,
            "extra_memory_bytes": self.held_bytes,
            "peak_memory_bytes": self.peak_bytes,
        }
