"""The recovery-strategy interface: the hooks a simulator strategy implements and what the trainer hands it.

Strategies are picked by name from :data:`checkfree.recovery.registry.REGISTRY`; their flags (``loses_state``,
``swaps``, ``recovers_stage0``, …) come from the one table of settings, :data:`checkfree.settings.TRAITS`.
:meth:`RecoveryStrategy.recover` returns one :class:`~checkfree.recovery.record.RecoveryRecord` per rebuilt stage,
which the trainer (checkfree/sim/trainer.py) writes; the other lines a strategy produces ("rollback",
"checkpoint", "snapshot") it writes itself the moment it produces them, through its context's
:meth:`StrategyContext.emit`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from checkfree.config import Config
from checkfree.recovery.record import RecoveryRecord
from checkfree.settings import HasSettingTraits
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)


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

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one metrics line (``{"kind": kind, **fields}``) now, after every line written before it."""


class RecoveryStrategy(HasSettingTraits):
    """Base class: a strategy reacts to whole-stage failures of the simulator.

    Hooks, in the order the trainer (checkfree/sim/trainer.py) calls them: :meth:`bind` (once), :meth:`setup`
    (once), then per iteration :meth:`begin_iteration`, :meth:`recover` (only when stages failed and
    ``loses_state``), :meth:`before_optimizer_step`, :meth:`after_step`; and :meth:`finish` (once). A hook
    writes its metrics lines with :meth:`emit`; :meth:`stats` goes to summary.json.

    Class attributes: ``name`` (the canonical registry name) and the setting's traits from
    :data:`checkfree.settings.TRAITS` (:class:`~checkfree.settings.HasSettingTraits`).
    """

    def __init__(self, cfg: Config, seed: int = 0):
        self.cfg = cfg
        self.seed = seed
        self.ctx: StrategyContext | None = None
        """The run context of :meth:`bind`; None before it."""

    def bind(self, ctx: StrategyContext) -> None:
        """Called once by the trainer with its run context; the default keeps it as ``self.ctx``."""
        self.ctx = ctx

    def emit(self, kind: str, **fields: Any) -> None:
        """Write one metrics line now through the run context (:meth:`StrategyContext.emit`).

        Raises:
            RuntimeError: before :meth:`bind` (a strategy used without a trainer must be bound to a context).
        """
        if self.ctx is None:
            raise RuntimeError(f"strategy {self.name!r} needs bind(ctx) before it writes a {kind!r} line.")
        self.ctx.emit(kind, **fields)

    def setup(self, state: TrainingState) -> None:
        """Called once before the first iteration (after a resume too)."""

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        """Called at the start of every iteration, before the stages in ``failed`` are lost (snapshots due now)."""

    def before_optimizer_step(self, state: TrainingState) -> None:
        """Called after forward/backward and the gradient all-reduce, before any optimizer step (parameters and
        optimizer state are still those of the iteration's start: an asynchronous snapshot must end here)."""

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        """Rebuild the stages in ``failed`` (already destroyed when ``loses_state``); one record per stage, in
        stage order (the trainer sets each record's ``iteration`` and writes it).

        Lines it produces on the way (a "rollback", a "checkpoint" committed meanwhile) it emits at once, so
        they come before the records."""
        raise NotImplementedError

    def after_step(self, state: TrainingState) -> None:
        """Called after every optimizer step (snapshots, replicas, copies)."""

    def finish(self, state: TrainingState) -> None:
        """Called once after the last iteration (wait for background saves)."""

    def stats(self) -> dict[str, Any]:
        """Costs this strategy measured (bytes, seconds) for summary.json."""
        return {}
