"""The recovery-strategy interface: the hooks a simulator strategy implements, its recovery record, and what the
trainer hands it.

Strategies are picked by name from :data:`checkfree.recovery.registry.REGISTRY`; their flags (``loses_state``,
``swaps``, ``recovers_stage0``, …) come from the one table of settings, :data:`checkfree.settings.TRAITS`.
A strategy writes no metrics itself: the lines it produces ("rollback", "checkpoint", "snapshot") wait in its
outbox until the trainer (checkfree/sim/trainer.py) takes them with :meth:`RecoveryStrategy.take_records` and
writes them, as it writes the recovery records :meth:`RecoveryStrategy.recover` returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from checkfree.config import Config
from checkfree.settings import HasSettingTraits
from checkfree.telemetry.metrics import Outbox
from checkfree.training_state import StateDict, TrainingState

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


class StrategyContext(Protocol):
    """What the trainer hands a strategy in :meth:`RecoveryStrategy.bind`: where and on which rank it runs
    (:class:`checkfree.sim.trainer.RunContext` is one)."""

    checkpoint_dir: Path | None
    """The run's checkpoint directory (the checkpoint baselines save under ``<it>/strategy``); None: none."""
    rank: int
    """This data-parallel rank (rank 0 alone writes checkpoints to disk)."""
    world_size: int
    """Data-parallel ranks; above 1 the ranks meet at a barrier before reading a checkpoint."""
    group: Any
    """The torch.distributed process group of the ranks (None with one rank)."""


class RecoveryStrategy(HasSettingTraits):
    """Base class: a strategy reacts to whole-stage failures of the simulator.

    Hooks, in the order the trainer (checkfree/sim/trainer.py) calls them: :meth:`bind` (once), :meth:`setup`
    (once), then per iteration :meth:`begin_iteration`, :meth:`recover` (only when stages failed and
    ``loses_state``), :meth:`before_optimizer_step`, :meth:`after_step`; and :meth:`finish` (once). After each
    hook the trainer writes what :meth:`take_records` returns; :meth:`stats` goes to summary.json.

    Class attributes: ``name`` (the canonical registry name) and the setting's traits from
    :data:`checkfree.settings.TRAITS` (:class:`~checkfree.settings.HasSettingTraits`).
    """

    def __init__(self, cfg: Config, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        self.ctx: StrategyContext | None = None
        """The run context of :meth:`bind`; None before it."""
        self.every = 0
        """Effective iterations between the strategy's own saves (checkpoints, snapshots), set by :meth:`setup`;
        0: it keeps none (checkfree.sim.progress reads it for a strategy with ``rollback_on_stage_loss``)."""
        self.stage0_copy: StateDict | None = None
        """CheckFree+'s copies of E and E⁻¹ (stage 0's state dict, paper §4.2), kept from :meth:`setup` on by a
        strategy with ``keeps_stage0_copy``; None: none kept (the "stage0_copy" rule cannot run)."""
        self.outbox = Outbox()
        """Metrics lines produced by the hooks, in order, until the trainer takes them (:meth:`take_records`)."""

    def bind(self, ctx: StrategyContext) -> None:
        """Called once by the trainer with its run context; the default keeps it as ``self.ctx``."""
        self.ctx = ctx

    def setup(self, state: TrainingState) -> None:
        """Called once before the first iteration (after a resume too)."""

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        """Called at the start of every iteration, before the stages in ``failed`` are lost (snapshots due now)."""

    def before_optimizer_step(self, state: TrainingState) -> None:
        """Called after forward/backward and the gradient all-reduce, before any optimizer step (parameters and
        optimizer state are still those of the iteration's start: an asynchronous snapshot must end here)."""

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        """Rebuild the stages in ``failed`` (already destroyed when ``loses_state``); one record per stage.

        Lines it produces on the way (a "rollback", a "checkpoint" committed meanwhile) go to the outbox; the
        trainer writes them before the returned records."""
        raise NotImplementedError

    def after_step(self, state: TrainingState) -> None:
        """Called after every optimizer step (snapshots, replicas, copies)."""

    def finish(self, state: TrainingState) -> None:
        """Called once after the last iteration (wait for background saves)."""

    def take_records(self) -> list[dict[str, Any]]:
        """The metrics lines the hooks produced since the last call, oldest first (``{"kind": …, **fields}``)."""
        return self.outbox.take()

    def stats(self) -> dict[str, Any]:
        """Costs this strategy measured (bytes, seconds) for summary.json."""
        return {}
