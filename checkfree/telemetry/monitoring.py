"""Live monitoring of a simulator run: TensorBoard scalars and a progress bar that appears on terminals only.

``--tensorboard`` mirrors every metrics.jsonl record to ``RUN_DIR/tensorboard/`` (``torch.utils.tensorboard``,
which needs the pinned ``tensorboard`` package; watch with ``tensorboard --logdir runs``). The tqdm bar is drawn
only when stderr is a terminal: redirected to a file, a CI log or ``nohup``, the periodic log lines are the
output, not carriage-return frames.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import IO, Any

TENSORBOARD_DIR = "tensorboard"


def is_terminal(stream: IO[str] | None) -> bool:
    """Whether ``stream`` is an interactive terminal (False for files, pipes, closed or missing streams)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed file
        return False


def progress_bar(total: int, initial: int, desc: str, stream: IO[str] | None = None) -> Any | None:
    """A tqdm bar on ``stream`` (default stderr) when it is a terminal, else None (the log lines suffice)."""
    stream = sys.stderr if stream is None else stream
    if not is_terminal(stream):
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="it", dynamic_ncols=True, file=stream)


class TensorBoardMirror:
    """Writes metrics records as TensorBoard scalars, with the record's wall-clock ``iteration`` as the step.

    train → train/loss, train/lr, train/tokens_per_second, train/mfu, train/grad_norm/stage_<s>;
    eval → eval/val_loss, eval/perplexity; failure → failure/stage, failure/count; recovery → recovery/stage,
    recovery/count; rollback → rollback/to_effective_iteration, rollback/iterations_lost, rollback/count. Other kinds and
    non-numeric fields are skipped. Raises ModuleNotFoundError (with the fix) when tensorboard is not installed.
    """

    def __init__(self, log_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                "--tensorboard needs the tensorboard package (pinned in requirements.txt; run ./setup.sh)."
            ) from exc
        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.counts: Counter[str] = Counter()

    def __call__(self, record: dict[str, Any]) -> None:
        kind, step = record.get("kind"), record.get("iteration")
        if not isinstance(step, int):
            return
        scalars: dict[str, Any] = {}
        if kind == "train":
            scalars = {f"train/{k}": record.get(k) for k in ("loss", "lr", "tokens_per_second", "mfu")}
            for s, norm in enumerate(record.get("grad_norms") or []):
                scalars[f"train/grad_norm/stage_{s}"] = norm
        elif kind == "eval":
            scalars = {"eval/val_loss": record.get("val_loss"), "eval/perplexity": record.get("perplexity")}
        elif kind in ("failure", "recovery"):
            self.counts[kind] += 1
            scalars = {f"{kind}/stage": record.get("stage"), f"{kind}/count": self.counts[kind]}
        elif kind == "rollback":
            self.counts[kind] += 1
            scalars = {f"rollback/{k}": record.get(k) for k in ("to_effective_iteration", "iterations_lost")}
            scalars["rollback/count"] = self.counts[kind]
        for tag, value in scalars.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        self.writer.close()
