"""metrics.jsonl: one JSON object per line with a "kind" field, flushed per line.

Each record is written with a single ``write`` of a complete line and flushed, so a run killed with SIGKILL
leaves a file in which every line parses (at worst the last record is missing). Lines are strict JSON
(checkfree.jsonio): a NaN or infinite value (a diverging loss) is ``null`` and listed under the line's
``"nonfinite"`` key; :func:`read_metrics` puts the values back.

Kinds written by the simulator (docs/simulator.md, Outputs): "train", "eval", "failure", "recovery", "rollback",
"checkpoint", "snapshot", "resume".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.schemas.limits import check_json_depth


def _finite(value: Any) -> Any:
    """``value`` with every NaN/inf float as None: what a mirror (TensorBoard) gets, which plots numbers only."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class MetricsSink:
    """Appends records to ``path`` (or drops them when ``path`` is None, e.g. on non-zero ranks), and hands each
    record to ``mirror`` when given (e.g. checkfree.telemetry.monitoring.TensorBoardMirror; its ``close`` is called too)."""

    def __init__(self, path: Path | None, mirror: Callable[[dict[str, Any]], None] | None = None):
        self.path = path
        self.mirror = mirror
        self._file = open(path, "a", encoding="utf-8") if path is not None else None  # noqa: SIM115

    def write(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"kind": kind, **fields}
        if self._file is not None:  # strict JSON: a NaN/inf is null, listed under "nonfinite"
            self._file.write(jsonio.dumps(record, separators=(",", ":")) + "\n")
            self._file.flush()
        if self.mirror is not None:
            self.mirror(_finite(record))
        return record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        close = getattr(self.mirror, "close", None)
        if close is not None:
            close()
        self.mirror = None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl; a torn last line (a run killed mid-write) is skipped.

    Raises:
        ValueError: a line other than the last is not a JSON object, or a line is nested deeper than 32 objects and
            lists (checkfree.schemas.limits, checked before it is parsed).
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        check_json_depth(line, f"{path}: line {i + 1}")  # a hand-edited line 100,000 deep: one sentence
        try:
            rec = jsonio.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise ValueError(
                f"{path}: line {i + 1} is not valid JSON; expected one JSON object per line."
            ) from None
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: line {i + 1} is not a JSON object.")
        records.append(rec)
    return records
