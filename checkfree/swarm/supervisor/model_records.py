"""What throughput.json records of the trained model: its validations, the model gathered at the end, the snapshots.

* ``validation``: one record per evaluation of the pipeline on the model config's fixed validation batches
  (checkfree.swarm.supervisor.validation): ``iteration`` (committed iterations = the weights' version), ``val_loss``
  (token-mean cross-entropy in nats, averaged over the batches as the simulator's ``evaluate`` does), ``perplexity``,
  ``batches``, ``seconds``, ``t`` (the results' clock when it ended). An evaluation counts in the wall time of the
  iteration after it, as a recovery does. ``first_eval`` / ``final_eval``: the first and the last (the
  simulator's summary.json keys). An evaluation given up (a node died, the deadline passed) is under
  ``validation_given_up`` with why.
* ``model``: the weights gathered from one serving replica per stage when the run ended
  (checkfree.swarm.supervisor.model_io), in the universal checkpoint format: ``path`` (``model/iter_<version>``),
  ``iteration``, ``nodes`` (stage → the node that sent it), ``bytes`` (tensor bytes fetched), ``fetch_s``,
  ``write_s``, ``seconds`` (both), ``tokenizer_dir``; or ``path`` null and ``why`` (one sentence) when no
  model could be gathered (a stage without a serving replica).
* ``snapshots``: with ``snapshot_every`` N > 0, a consolidated snapshot (weights and Adam state of every stage)
  every N committed iterations, fetched while training goes on and written by a background thread into
  ``snapshots/iter_<version>``: per snapshot ``iteration``, ``path``, ``bytes``, ``fetch_s``, ``write_s``, the wall
  seconds of the iteration it was fetched during (``iteration_s``), ``stall_s`` (that minus the median iteration
  without a snapshot or a validation) and ``stall_ratio`` (``stall_s`` / that median); ``newest`` (path and
  iteration of the newest complete one: what a resumed supervisor can restore a stage from), the totals and the
  mean ``stall_ratio``; ``given_up`` lists those that did not complete, with why.

:class:`ModelRecords` is plain data (lists and dicts of numbers and strings): :meth:`ModelRecords.to_json` and
:meth:`ModelRecords.load` let a journal keep it.
"""

from __future__ import annotations

import statistics
from typing import Any


class ModelRecords:
    """The records above, filled by the validation runs and the model's I/O; read into throughput.json."""

    def __init__(self, snapshot_every: int = 0) -> None:
        self.snapshot_every = snapshot_every
        self.validation: list[dict[str, Any]] = []
        self.validation_given_up: list[dict[str, Any]] = []
        self.model: dict[str, Any] | None = None
        self.snapshots: list[dict[str, Any]] = []
        self.snapshots_given_up: list[dict[str, Any]] = []

    @property
    def newest_snapshot(self) -> dict[str, Any] | None:
        """``{"path", "iteration"}`` of the newest complete snapshot (None: none yet)."""
        if not self.snapshots:
            return None
        newest = max(self.snapshots, key=lambda s: s["iteration"])
        return {"path": newest["path"], "iteration": newest["iteration"]}

    def stalls(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each snapshot with the wall time of the iteration it was fetched during (the first commit after its
        request: ``rows`` are throughput.json's iterations) against the median iteration without a snapshot or a
        validation in it."""
        busy = {_during(rows, s["t_requested"]) for s in self.snapshots} | {
            _during(rows, v["t"]) for v in self.validation
        }
        quiet = [r["wall_s"] for i, r in enumerate(rows) if i not in busy]
        median = statistics.median(quiet) if quiet else None
        out = []
        for snap in self.snapshots:
            i = _during(rows, snap["t_requested"])
            wall = rows[i]["wall_s"] if i is not None else None
            stall = wall - median if wall is not None and median else None
            out.append(
                snap
                | {
                    "iteration_s": wall,
                    "stall_s": stall,
                    "stall_ratio": stall / median if stall is not None and median else None,
                }
            )
        return out

    def to_json(self, rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The keys of throughput.json (module docstring); ``rows``: its iterations (for the snapshots' stall)."""
        snaps = self.stalls(rows or [])
        ratios = [s["stall_ratio"] for s in snaps if s["stall_ratio"] is not None]
        return {
            "validation": self.validation,
            "validation_given_up": self.validation_given_up,
            "first_eval": self.validation[0] if self.validation else None,
            "final_eval": self.validation[-1] if self.validation else None,
            "model": self.model,
            "snapshots": {
                "every": self.snapshot_every,
                "written": snaps,
                "given_up": self.snapshots_given_up,
                "count": len(snaps),
                "bytes": sum(s["bytes"] for s in snaps),
                "stall_ratio": statistics.mean(ratios) if ratios else None,
                "newest": self.newest_snapshot,
            },
        }

    def state(self) -> dict[str, Any]:
        """Everything recorded so far, as plain data (for a journal; :meth:`load` reads it back)."""
        return {
            "snapshot_every": self.snapshot_every,
            "validation": self.validation,
            "validation_given_up": self.validation_given_up,
            "model": self.model,
            "snapshots": self.snapshots,
            "snapshots_given_up": self.snapshots_given_up,
        }

    def load(self, data: dict[str, Any]) -> None:
        """Take what :meth:`state` wrote (a resumed supervisor's journal).

        Raises:
            KeyError, TypeError: ``data`` is not what :meth:`state` writes.
        """
        self.snapshot_every = int(data["snapshot_every"])
        self.validation = list(data["validation"])
        self.validation_given_up = list(data["validation_given_up"])
        self.model = data["model"]
        self.snapshots = list(data["snapshots"])
        self.snapshots_given_up = list(data["snapshots_given_up"])


def _during(rows: list[dict[str, Any]], t: float) -> int | None:
    """Index of the first iteration committed after time ``t`` (None: none)."""
    return next((i for i, r in enumerate(rows) if r["t_commit"] > t), None)
