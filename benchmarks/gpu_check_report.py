"""What benchmarks/gpu_check.py writes to OUT_DIR: gpu_check.md, gpu_check.json and gpu_check_logs.tar.gz.

Every row is printed when it is measured and written to both report files at once, with the check's signals
(SIGALRM: a section's budget; SIGTERM, SIGINT: the end of the check) blocked while it is written, so a row is
never half written and a check cut short keeps every row it measured. gpu_check_logs.tar.gz, written last (also
after SIGTERM), holds the runs' logs and summaries from the scratch directory, small files only: what a borrowed
machine leaves behind once it is given back.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import signal
import tarfile
from collections.abc import Iterator
from pathlib import Path

REPORT_FILES = ("gpu_check.md", "gpu_check.json", "gpu_check_logs.tar.gz")
"""Everything the check writes to OUT_DIR."""
CHECK_SIGNALS = {signal.SIGALRM, signal.SIGTERM, signal.SIGINT}
LOG_SUFFIXES = (".log", ".json", ".jsonl", ".txt", ".md")
LOG_FILE_MAX_BYTES = 2 << 20
# What a swarm run dir holds that is a secret (mode 0600 there): the node key files, the join tokens and the
# supervisor's journal (the swarm secret). A report that travels never carries them.
SECRET_PARTS = frozenset({"keys", "join_tokens", "journal.json"})
"""A scratch file larger than this (2 MiB) stays out of the logs archive (only metrics.jsonl of long runs is)."""


def now() -> str:
    """The UTC time, to the second, as the report writes it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold the check's signals (:data:`CHECK_SIGNALS`) until the block ends; one that arrives meanwhile is
    delivered, and its handler runs, right after it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, CHECK_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def finite(obj: object) -> object:
    """``obj`` with every non-finite float as None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def out_dir_for(value: str | None, root: Path) -> Path:
    """OUT_DIR: the given directory, or ``root``/runs/gpu_check-<UTC time>. Raises ValueError (one sentence) for a
    file, or for a directory that already holds one of :data:`REPORT_FILES`."""
    if not value:
        return root / "runs" / f"gpu_check-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    out = Path(value)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"OUT_DIR {out} is a file; expected a directory for gpu_check.md and gpu_check.json."
        )
    taken = [f for f in REPORT_FILES if (out / f).exists()]
    if taken:
        raise ValueError(f"OUT_DIR {out} already holds {taken[0]}; expected a new or empty directory.")
    return out


class Report:
    """OUT_DIR/gpu_check.md and OUT_DIR/gpu_check.json, brought up to date at every row.

    The Markdown file is appended to (a header, then one table line per row, then the verdict); the JSON file is
    rewritten whole through a temporary file and a rename, so a reader never sees half of it. It is strict JSON
    (``allow_nan=False``; a non-finite number is written as null). ``status`` is "running" until the end, then
    "passed", "failed", "terminated" (SIGTERM) or "interrupted" (SIGINT).
    """

    def __init__(self, out_dir: Path, header: dict[str, object]):
        self.out_dir = out_dir
        self.md = out_dir / "gpu_check.md"
        self.rows: list[tuple[str, str, str]] = []
        self.data: dict[str, object] = {
            "format": "checkfree-gpu-check-v2",
            "status": "running",
            **header,
            "updated": header["started"],
            "sections": [],
            "rows": [],
        }
        with signals_held():
            out_dir.mkdir(parents=True, exist_ok=True)
            lines = [f"# gpu_check, {header['started']}", ""]
            lines += [f"- {k}: {v}" for k, v in header.items() if k != "started"]
            lines += ["", "| section | metric | value |", "|---|---|---|"]
            self.md.write_text("\n".join(lines) + "\n")
            self._write_json()

    def row(self, section: str, metric: str, value: str) -> None:
        """Print one measured row now and write it to both files."""
        with signals_held():
            self.rows.append((section, metric, value))
            print(f"  {section:<38} {metric:<34} {value}", flush=True)
            self.data["rows"].append({"section": section, "metric": metric, "value": value})
            cells = (c.replace("|", "\\|") for c in (section, metric, value))
            with open(self.md, "a") as f:
                f.write("| " + " | ".join(cells) + " |\n")
            self._write_json()

    def section(
        self,
        number: int,
        title: str,
        budget_s: float | None,
        seconds: float,
        ok: bool | None,
        ended: str,
    ) -> None:
        """Record a section's end: its budget and seconds, ``ok`` (None: nothing to judge, e.g. skipped) and how
        it ``ended`` ("finished", "error", "budget", "skipped", "terminated", "interrupted")."""
        with signals_held():
            self.data["sections"].append(
                {
                    "number": number,
                    "title": title,
                    "budget_s": budget_s,
                    "seconds": round(seconds, 4),  # a smoke section can take under 0.05 s: no 0.0
                    "ok": ok,
                    "ended": ended,
                }
            )
            self._write_json()

    def finish(self, status: str, verdict: str) -> None:
        """The closing status and verdict line."""
        with signals_held():
            self.data["status"] = status
            with open(self.md, "a") as f:
                f.write(f"\n{verdict}\n")
            self._write_json()

    def table(self) -> str:
        """The rows as one aligned text table (printed at the end of a check)."""
        width = max([len(r[0]) for r in self.rows] + [7])
        lines = [f"{'section':<{width}} | {'metric':<34} | value", f"{'-' * width}-|-{'-' * 34}-|-{'-' * 20}"]
        lines += [f"{s:<{width}} | {m:<34} | {v}" for s, m, v in self.rows]
        return "\n".join(lines)

    def archive_logs(self, scratch: Path) -> Path:
        """gpu_check_logs.tar.gz: the scratch directory's logs, summaries and metrics (files of
        :data:`LOG_SUFFIXES` up to :data:`LOG_FILE_MAX_BYTES`; no checkpoints, token caches or SMOKE's corpus, and
        no secrets of the swarm's run, :data:`SECRET_PARTS`)."""
        path = self.out_dir / "gpu_check_logs.tar.gz"
        with signals_held(), tarfile.open(path, "w:gz") as tar:
            for f in sorted(scratch.rglob("*")):
                if (
                    f.is_file()
                    and not f.is_symlink()
                    and f.suffix in LOG_SUFFIXES
                    and f.stat().st_size <= LOG_FILE_MAX_BYTES
                    and not ({"cache", "corpus"} | SECRET_PARTS) & set(f.relative_to(scratch).parts)
                ):
                    tar.add(f, arcname=str(Path("scratch") / f.relative_to(scratch)))
        return path

    def _write_json(self) -> None:
        self.data["updated"] = now()
        tmp = self.out_dir / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(finite(self.data), indent=1, allow_nan=False) + "\n")
        os.replace(tmp, self.out_dir / "gpu_check.json")
