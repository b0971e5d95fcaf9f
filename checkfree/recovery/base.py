"""The recovery-strategy interface: the hooks a simulator strategy implements, and its recovery record.

Strategies are picked by name from :data:`checkfree.recovery.registry.REGISTRY`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from checkfree.config import Config
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)


@dataclass
class RecoveryRecord:
    """What a strategy did for one failed stage (one "recovery" line of metrics.jsonl)."""

    stage: int
    strategy: str
    sources: list[int] = field(default_factory=list)
    """Stages the new weights came from (empty for random init or a checkpoint restore)."""
    weights: list[float] | None = None
    """Weights given to ``sources`` (CheckFree: ω_{i−1}/(ω_{i−1}+ω_{i+1}), …)."""
    rule: str = ""
    """The rule applied, e.g. "checkfree", "copy", "rollback", "ec_decode"."""
    consecutive: bool = False
    """A neighbour of this stage failed in the same iteration."""
    fallback: str | None = None
    """Set when the strategy's own rule could not apply and a documented fallback was used."""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_metrics(self, iteration: int) -> dict[str, Any]:
        d = {
            "kind": "recovery",
            "iteration": iteration,
            "stage": self.stage,
            "strategy": self.strategy,
            "rule": self.rule,
            "sources": self.sources,
            "weights": self.weights,
            "consecutive": self.consecutive,
            "fallback": self.fallback,
            "seconds": round(self.seconds, 6),
        }
        d.update(self.extra)
        return d


class RecoveryStrategy:
    """Base class: a strategy reacts to whole-stage failures of the simulator.

    Class attributes:
        name: canonical registry name.
        loses_state: False only for ``no_failure`` (failures are logged, nothing is lost).
        recovers_stage0: whether a failure of stage 0 (embedding + head) can be recovered.
        requires_swaps: the strategy only makes sense with CheckFree+ out-of-order execution.
    """

    name: ClassVar[str] = ""
    loses_state: ClassVar[bool] = True
    recovers_stage0: ClassVar[bool] = False
    requires_swaps: ClassVar[bool] = False

    def __init__(self, cfg: Config, seed: int = 0):
        self.cfg = cfg
        self.seed = seed

    def bind(self, ctx: Any) -> None:
        """Called once by the trainer with its run context (metrics sink, checkpoint directory, rank, group).

        Strategies that keep state write their own records ("rollback", "checkpoint", "snapshot") through
        ``ctx.sink``. The default keeps it as ``self.ctx``.
        """
        self.ctx = ctx

    def setup(self, state: TrainingState) -> None:
        """Called once before the first iteration (after a resume too)."""

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        """Called at the start of every iteration, before the stages in ``failed`` are lost (snapshots due now)."""

    def before_optimizer_step(self, state: TrainingState) -> None:
        """Called after forward/backward and the gradient all-reduce, before any optimizer step (parameters and
        optimizer state are still those of the iteration's start: an asynchronous snapshot must end here)."""

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        """Rebuild the stages in ``failed`` (already destroyed when ``loses_state``); one record per stage."""
        raise NotImplementedError

    def after_step(self, state: TrainingState) -> None:
        """Called after every optimizer step (snapshots, replicas, copies)."""

    def finish(self, state: TrainingState) -> None:
        """Called once after the last iteration (wait for background saves)."""

    def stats(self) -> dict[str, Any]:
        """Costs this strategy measured (bytes, seconds) for summary.json."""
        return {}
