"""The failure schedule as the supervisor replays it: who goes down when, and who comes back when.

Two kinds of schedule (checkfree.failures):

- **Crash iterations** (the authors' ``failure_p_configs/RATE.json``, docs/paper.md §8): slot n's node is
  SIGKILLed during the first attempt of each listed training iteration and replaced at once; a redone iteration
  (an aborted attempt, a rollback) does not fire it again.
- **Down intervals** (``checkfree-slot-downtime-v1``, mapped from a real preemption trace,
  checkfree.failures.traces): time runs on a *schedule clock* of iterations (one per committed iteration, also
  when a rollback redoes it, plus one per iteration the swarm waited). A slot's node is killed in the attempt in
  which the clock reaches the interval's down iteration, and the slot stays *away* (no replacement) until the
  clock reaches its up iteration; ``[k, k]`` is a crash with an immediate replacement. While a slot is away its
  stage trains on the replicas left: every pipeline still runs (checkfree.swarm.config.route sends a missing
  replica's microbatches round-robin to its stage's live replicas, the global batch stays the same) and the
  stage's gradients are the live replicas' average (checkfree.swarm.node.gradient_sync). When every replica of a
  stage is away, the stage is lost and training cannot go on: the swarm waits (:meth:`Outages.wait_for_returns`),
  one schedule iteration per ``reference_s`` seconds (the median committed iteration so far, so a waited
  iteration lasts as long as a trained one), firing the crashes and returns that fall in the wait, until a node of
  every lost stage comes back; the returning node then recovers the stage by the setting's rule (CheckFree,
  CheckFree+, checkpoint rollback, ladder), as any replacement does. A replay ends when the clock reaches the
schedule's end (:meth:`Outages.over`), or earlier at ``--iterations``: a trace's window is the run's length,
and a stage with no node back before that end is waited out to it.

:class:`Outages` holds the schedule, the clock and which crashes fired; the slots' ``away`` / ``back_at``
(checkfree.swarm.supervisor.roster.Slot) say which slots it keeps down.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from checkfree.failures.traces import DowntimeSchedule
from checkfree.swarm.supervisor.roster import Roster, Slot

log = logging.getLogger("checkfree.swarm.supervisor.supervisor")


class Outages:
    """Which slots go down in an attempt, which come back, and the wait for a lost stage's returning node.

    Args:
        schedule: {slot: crash iterations} (the authors' node format) or a :class:`DowntimeSchedule`.
        roster: the slots (their ``away`` / ``back_at`` are set here).
    """

    def __init__(self, schedule: dict[int, list[int]] | DowntimeSchedule, roster: Roster) -> None:
        self.roster = roster
        self.downtime = schedule if isinstance(schedule, DowntimeSchedule) else None
        self.crashes = schedule.node_crashes() if isinstance(schedule, DowntimeSchedule) else dict(schedule)
        self.clock = 0
        """Schedule iterations elapsed (down-interval schedules; committed iterations + waited iterations)."""
        self.fired: set[tuple[int, int]] = set()
        """(slot, schedule iteration) of the crashes already fired (a redone iteration does not refire)."""

    def due(self, it: int) -> list[Slot]:
        """The slots whose scheduled crash falls in the attempt at training iteration ``it`` (down intervals: every
        crash at or before the clock that has not fired)."""
        out = []
        for slot in self.roster.slots:
            times = self.crashes.get(slot.slot, [])
            if self.downtime is None:
                hit = it in times and (slot.slot, it) not in self.fired
            else:
                hit = any(d <= self.clock and (slot.slot, d) not in self.fired for d in times)
            if hit:
                out.append(slot)
        return out

    def fire(self, slot: Slot, it: int) -> int:
        """Mark ``slot``'s due crash fired; returns its schedule iteration (``it`` for crash iterations)."""
        if self.downtime is None:
            self.fired.add((slot.slot, it))
            return it
        down = min(d for d in self.crashes[slot.slot] if d <= self.clock and (slot.slot, d) not in self.fired)
        self.fired.add((slot.slot, down))
        return down

    def keep_away(self, slot: Slot, down: int) -> bool:
        """After ``slot``'s node was killed at schedule iteration ``down``: keep the slot away until its up
        iteration (True), or let it be replaced at once (False: crash iterations, a ``[k, k]`` interval, or an up
        iteration the clock has reached)."""
        if self.downtime is None:
            return False
        up = self.downtime.back_at(slot.slot, down)
        if up is not None and up <= self.clock:
            return False
        slot.away, slot.back_at = True, up
        log.info(
            "supervisor: slot %d (stage %d) is down from schedule iteration %d until %s",
            slot.slot,
            slot.stage,
            down,
            "the end of the schedule" if up is None else up,
        )
        return True

    def committed(self) -> None:
        """An iteration was committed: the schedule clock moves on by one."""
        self.clock += 1

    def bring_back(self) -> list[Slot]:
        """Slots whose up iteration the clock reached stop being away (they get a replacement like a crashed
        slot); returns them."""
        back = [s for s in self.roster.slots if s.away and s.back_at is not None and s.back_at <= self.clock]
        for slot in back:
            slot.away, slot.back_at = False, None
            log.info(
                "supervisor: slot %d (stage %d) comes back at schedule iteration %d",
                slot.slot,
                slot.stage,
                self.clock,
            )
        return back

    def stranded(self) -> list[int]:
        """Stages every replica of which is away: lost, with no replacement to start until a node comes back."""
        by_stage: dict[int, list[Slot]] = {}
        for slot in self.roster.slots:
            by_stage.setdefault(slot.stage, []).append(slot)
        return sorted(s for s, slots in by_stage.items() if all(x.away for x in slots))

    def wait_for_returns(
        self,
        reference_s: float,
        idle: Callable[[float], None],
        kill: Callable[[Slot, int], None],
    ) -> tuple[dict[int, int], float, int]:
        """Wait while a stage is lost with every replica away: one schedule iteration per ``reference_s`` seconds,
        firing the crashes (``kill(slot, down)``) and returns due meanwhile, until every lost stage has a slot
        coming back, or until the schedule is over (:meth:`over`: no node of the stage comes back within it).

        Args:
            reference_s: seconds one waited schedule iteration lasts (> 0).
            idle: ``idle(seconds)`` keeps the supervisor serving messages for that long.
            kill: SIGKILLs a slot's node for a crash falling in the wait (the caller records and parks it).

        Returns:
            (stage → schedule iterations it waited, seconds waited, the clock when the wait began); empty, 0.0
            when no stage is stranded.
        """
        waited: dict[int, int] = {}
        start_clock, t0 = self.clock, time.monotonic()
        stranded = self.stranded()
        while stranded and not self.over():
            for stage in stranded:
                waited[stage] = waited.get(stage, 0) + 1
            idle(reference_s)
            self.clock += 1
            for slot in self.due(self.clock):  # down intervals go by the clock, not a training iteration
                kill(slot, self.fire(slot, self.clock))
            self.bring_back()
            stranded = self.stranded()
        return waited, time.monotonic() - t0, start_clock

    def over(self) -> bool:
        """The schedule's time is over (down intervals: the clock reached its last iteration): the replay ends."""
        return self.downtime is not None and self.clock >= self.downtime.iterations
