"""The checkpoint baseline on the supervisor's side: which versions the storage node holds (docs/paper.md §8).

Under ``checkpoint`` (the paper's baseline, Table 1), one replica of every stage sends its weights and Adam
state to the storage node every ``checkpoint_every`` iterations (``commit`` names the senders); the storage
node reports each stored ``(stage, version)``. A whole-stage loss rolls every node back to the newest version
that *every* stage stored, and the iterations since are redone (the supervisor's rollback,
checkfree.swarm.supervisor.phases.rolling_back). When the storage node itself dies its checkpoints go with it:
:meth:`StoredCheckpoints.forget` drops them and remembers when, so a later stage loss names that cause instead
of failing with a bare "no checkpoint".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class StoredCheckpoints:
    """The versions the storage node reported stored, per stage (plain data: part of the supervisor's state).

    Attributes:
        n_stages: transformer stages S (stages 0..S store). stored: stage → versions (iterations) stored.
        lost_at: the iteration during which the storage node died (its checkpoints went with it), or None.
    """

    n_stages: int
    stored: dict[int, set[int]] = field(default_factory=dict)
    lost_at: int | None = None

    def record(self, stage: int, version: int) -> None:
        """The storage node stored ``stage`` at ``version``."""
        self.stored.setdefault(stage, set()).add(version)

    def forget(self, iteration: int) -> None:
        """The storage node died during ``iteration``: everything it held is gone."""
        if self.stored:
            log.warning(
                "supervisor: the storage node is gone; the checkpoints it held (%s) are lost",
                {s: sorted(v) for s, v in self.stored.items()},
            )
            self.stored.clear()
            self.lost_at = iteration

    def complete_versions(self) -> set[int]:
        """Versions that every stage has stored."""
        if not self.stored:
            return set()
        return set.intersection(*(self.stored.get(s, set()) for s in range(self.n_stages + 1)))

    def has_complete(self) -> bool:
        return bool(self.complete_versions())

    def newest_complete(self) -> int:
        """Newest version that every stage has stored (0 if none)."""
        return max(self.complete_versions(), default=0)

    def holds_initial(self) -> bool:
        """Every stage stored version 0 (the initial checkpoint, before training starts)."""
        return all(0 in self.stored.get(s, set()) for s in range(self.n_stages + 1))

    def missing_cause(self) -> str:
        """Why no complete checkpoint exists (for the error of an unrecoverable stage loss)."""
        if self.lost_at is not None:
            return f"the storage node restarted during iteration {self.lost_at} and lost every checkpoint"
        return "the storage node holds no checkpoint every stage stored"
