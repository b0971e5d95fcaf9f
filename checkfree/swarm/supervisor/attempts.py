"""One attempt at one training iteration, as the supervisor runs it (an *epoch*).

    begin(epoch, members) → stage-0 nodes run their pipelines → ITERATION_END from every pipeline
    → sync → every node averages its stage's gradients with its replicas → ready (grad norm)
    → commit → Adam step → committed (stats)        — the commit time is the aggregation timestamp

Scheduled crashes (checkfree.swarm.supervisor.outages: which slots, and whether a slot then stays away for a
while) fire ``crash_point`` × (last iteration time) seconds after ``begin``, while microbatches are
in flight, or at the latest when the attempt reaches ``sync`` (every pipeline's ITERATION_END is in): the
crash then fires at once, not at the estimated moment, which after a long iteration (one with a recovery)
can lie minutes past the end of the forward phase. A death before ``commit`` aborts the epoch
everywhere (no optimizer has stepped, so nothing is half-applied) and the iteration is redone after
recovery; a stall or a timeout aborts and retries it, at most ``max_attempts`` times.

The attempt in progress (:class:`Epoch`: its number, iteration, members, phase and start) is public, so the
supervisor's checks of the nodes' reports (checkfree.swarm.supervisor.inbox) can tell a report that fits it
from an impossible one: a ``ready`` before ``sync``, a ``stalled`` before any microbatch can have timed out.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.policies import SwarmRecovery
from checkfree.swarm.supervisor.outages import Outages
from checkfree.swarm.supervisor.processes import Processes
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.roster import Link, Roster, Slot, SwarmError

log = logging.getLogger("checkfree.swarm.supervisor.supervisor")


@dataclass
class Epoch:
    """The attempt in progress, as the checks of the nodes' reports need it.

    Attributes:
        number: the epoch. iteration: the iteration it attempts. members: stage → the nodes that serve it in
        this epoch. t_begin: when ``begin`` was broadcast (the attempts' clock, seconds). phase: ``forward``,
        ``sync`` (broadcast), ``commit`` (broadcast) or ``over`` (committed or aborted: later reports of this
        epoch are stale). reported: command → the nodes whose report of it this epoch was taken (a second one
        is refused).
    """

    number: int
    iteration: int
    members: dict[int, list[int]]
    t_begin: float
    phase: str = "forward"
    reported: dict[str, set[int]] = field(default_factory=dict)

    def nodes(self) -> list[int]:
        """Every member of this epoch."""
        return [n for ids in self.members.values() for n in ids]


class Attempts:
    """Runs attempts at iterations (one epoch each) and fires the scheduled crashes.

    Args:
        cfg: topology and limits. strategy: the setting (does it kill, does it keep checkpoints).
        outages: the failure schedule's replay. roster, link, processes, results: the supervisor's parts.
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        strategy: SwarmRecovery,
        outages: Outages,
        roster: Roster,
        link: Link,
        processes: Processes,
        results: Results,
    ) -> None:
        self.cfg, self.strategy, self.outages = cfg, strategy, outages
        self.roster, self.link, self.processes, self.results = roster, link, processes, results
        self.epoch = 0
        """The current attempt's number (stale messages of older epochs are dropped by the nodes)."""
        self.clock = time.monotonic
        """Seconds (monotonic); tests replace it."""
        self.current: Epoch | None = None
        """The attempt in progress, or the last one (phase ``over``); None before the first."""

    def attempt(self, it: int) -> bool:
        """One epoch of iteration ``it``; True when committed, False when aborted (redo).

        Raises:
            SwarmError: iteration ``it`` failed ``max_attempts`` attempts.
        """
        link, roster = self.link, self.roster
        self.epoch += 1
        epoch, members = self.epoch, roster.members()
        link.inbox.clear()
        self.results.current_iteration = it
        t_begin = self.clock()
        self.current = Epoch(epoch, it, members, t_begin)
        link.broadcast("begin", epoch=epoch, iteration=it, members={str(k): v for k, v in members.items()})
        due = self.outages.due(it)
        crash_at = t_begin + self.cfg.crash_point * self.results.last_wall_s() if due else None
        deadline = t_begin + self.cfg.iteration_timeout
        try:
            return self._wait(epoch, it, members, due, crash_at, deadline)
        finally:
            self.current.phase = "over"  # later reports of this epoch are stale

    def _wait(
        self,
        epoch: int,
        it: int,
        members: dict[int, list[int]],
        due: list[Slot],
        crash_at: float | None,
        deadline: float,
    ) -> bool:
        """The attempt's loop: forward → sync → commit; True when committed, False when aborted."""
        link, roster, current = self.link, self.roster, self.current
        assert current is not None
        nodes, phase = current.nodes(), "forward"
        while True:
            link.poll()
            now = self.clock()
            if crash_at is not None and (now >= crash_at or phase != "forward"):
                self._fire(due, it)
                crash_at = None
            if self.processes.check_deaths() and phase != "commit":
                return self._abort(epoch, "a node died")
            got = {k: {n: m for n, m in v.items() if m.get("epoch") == epoch} for k, v in link.inbox.items()}
            alive = [n for n in nodes if not roster.by_node[n].dead]
            if phase == "forward" and set(members[0]) <= set(got.get("iteration_end", {})):
                if crash_at is not None:  # at the latest now, before the gradient exchange
                    self._fire(due, it)
                    crash_at = None
                    continue  # the death aborts this attempt
                phase = current.phase = "sync"
                link.broadcast("sync", epoch=epoch)
            elif phase == "sync" and set(nodes) <= set(got.get("ready", {})):
                phase = current.phase = "commit"
                self._commit(epoch, it, members)
            elif phase == "commit" and set(alive) <= set(got.get("committed", {})):
                self.results.iteration(it, epoch, got["iteration_end"], got["ready"], members)
                self.outages.committed()
                row = self.results.rows[-1]
                log.info(
                    "supervisor: iteration %d committed: %.3f s, loss %.4f", it, row["wall_s"], row["loss"]
                )
                return True
            if got.get("stalled"):
                return self._retry(epoch, it, f"stalled: {next(iter(got['stalled'].values()))['reason']}")
            if now > deadline:
                return self._retry(epoch, it, f"no commit within {self.cfg.iteration_timeout:.0f} s")

    def _fire(self, due: list[Slot], it: int) -> None:
        for slot in due:
            self.crash(slot, it, self.outages.fire(slot, it))

    def crash(self, slot: Slot, it: int, down: int) -> None:
        """The scheduled crash of ``slot`` at schedule iteration ``down`` (during training iteration ``it``): kill
        its node and keep the slot away as long as the schedule says; ``no_failure`` logs it and kills nobody."""
        if not self.strategy.loses_state:
            self.results.skipped.append({"slot": slot.slot, "stage": slot.stage, "iteration": it})
            log.info(
                "supervisor: scheduled crash of slot %d at iteration %d skipped (no_failure)", slot.slot, it
            )
            return
        if (
            not slot.dead
        ):  # else its node is gone already (it came back and was not replaced yet): it stays away
            self.results.scheduled_kill(slot, it)
            self.processes.kill(slot, f"scheduled crash at iteration {it}")
        if self.outages.keep_away(slot, down):
            self.results.kept_away(slot)

    def _commit(self, epoch: int, it: int, members: dict[int, list[int]]) -> None:
        meta: dict[str, Any] = {"epoch": epoch, "iteration": it}
        if self.roster.storage is not None and (it + 1) % self.cfg.checkpoint_interval == 0:
            meta["checkpoint_senders"] = [ids[0] for ids in members.values() if ids]
        self.link.broadcast("commit", **meta)

    def _abort(self, epoch: int, why: str) -> bool:
        log.warning("supervisor: epoch %d aborted (%s); the iteration is redone after recovery", epoch, why)
        self.link.broadcast("abort", epoch=epoch)
        self.results.aborts += 1
        return False

    def _retry(self, epoch: int, it: int, why: str) -> bool:
        self.results.failed_attempts[it] = self.results.failed_attempts.get(it, 0) + 1
        if self.results.failed_attempts[it] >= self.cfg.max_attempts:
            self.link.broadcast("abort", epoch=epoch)
            raise SwarmError(f"iteration {it} failed {self.cfg.max_attempts} attempts; last: {why}.")
        return self._abort(epoch, why)
