"""The checkpoint baseline on the supervisor's side: what the storage node holds, and rolling back to it.

Under ``checkpoint`` (the paper's baseline, Table 1), one replica of every stage sends its weights and Adam
state to the storage node every ``checkpoint_interval`` iterations (``commit`` names the senders); the storage
node reports each stored ``(stage, version)``. A whole-stage loss rolls every node back to the newest version
that *every* stage stored, and the iterations since are redone. When the storage node itself dies its
checkpoints go with it: :meth:`Checkpoints.forget` drops them and remembers when, so a later stage loss
names that cause instead of failing with a bare "no checkpoint".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.roster import Link, Roster, SwarmError

log = logging.getLogger("checkfree.swarm.supervisor.supervisor")


class Checkpoints:
    """Versions the storage node holds per stage, and the rollback to the newest complete one.

    Args:
        cfg: the topology (stages, ``recovery_timeout``). roster: the slots (their ``version``).
        link: messages to nodes and their reports.
    """

    def __init__(self, cfg: SwarmConfig, roster: Roster, link: Link) -> None:
        self.cfg, self.roster, self.link = cfg, roster, link
        self.stored: dict[int, set[int]] = {}
        """Stage → versions (iterations) the storage node reported stored."""
        self.lost_at: int | None = None
        """The iteration during which the storage node died (its checkpoints went with it), or None."""

    def _stages(self) -> range:
        return range(self.cfg.n_stages + 1)

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
        return set.intersection(*(self.stored.get(s, set()) for s in self._stages()))

    def has_complete(self) -> bool:
        return bool(self.complete_versions())

    def newest_complete(self) -> int:
        """Newest version that every stage has stored (0 if none)."""
        return max(self.complete_versions(), default=0)

    def missing_cause(self) -> str:
        """Why no complete checkpoint exists (for the error of an unrecoverable stage loss)."""
        if self.lost_at is not None:
            return f"the storage node restarted during iteration {self.lost_at} and lost every checkpoint"
        return "the storage node holds no checkpoint every stage stored"

    def senders(self) -> list[int]:
        """One serving replica per stage: the nodes that send their stage to the storage node."""
        return [ids[0] for ids in self.roster.members().values() if ids]

    def store_initial(self) -> None:
        """Have every stage store version 0 before training starts.

        Raises:
            SwarmError: the storage node did not store it within ``recovery_timeout``.
        """
        self.link.broadcast("checkpoint", checkpoint_senders=self.senders())
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not all(0 in self.stored.get(s, set()) for s in self._stages()):
            if time.monotonic() > deadline:
                raise SwarmError("the storage node did not store the initial checkpoint in time.")
            self.link.poll(0.02)

    def rollback(self, version: int, check_deaths: Callable[[], bool]) -> int:
        """Roll every serving node not at ``version`` back to it (a slot the schedule keeps away copies a live
        replica when it comes back) and wait until each restored it; returns the bytes
        the nodes restored.

        Raises:
            SwarmError: a node died (``check_deaths`` returned True), the storage node died (its checkpoints
                with it), or the rollback timed out.
        """
        targets = {s.occupant for s in self.roster.slots if s.serving and s.version != version}
        log.warning(
            "supervisor: a whole stage was lost; rolling %d nodes back to iteration %d", len(targets), version
        )
        self.link.inbox.pop("restored", None)
        for node in targets:
            self.link.command(node, "rollback", version=version)
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not targets <= set(self.link.reported("restored")):
            self.link.poll(0.02, police=False)  # no eviction mid-rollback: a death here fails the run
            storage_died = self.roster.storage is not None and self.roster.storage.dead
            if check_deaths() or storage_died or time.monotonic() > deadline:
                raise SwarmError(
                    f"rollback to iteration {version} did not finish (a node or the storage node died, or it "
                    "timed out)."
                )
        return sum(m.get("bytes", 0) for m in self.link.reported("restored").values())
