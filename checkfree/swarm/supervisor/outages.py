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
  stage is away, the stage is lost and training cannot go on: the supervisor waits, one schedule iteration
  (:meth:`Outages.advance`) per ``reference_s`` seconds (the median committed iteration so far, so a waited
  iteration lasts as long as a trained one), firing the crashes and returns that fall in the wait, until a node of
  every lost stage comes back (checkfree.swarm.supervisor.phases.waiting); the returning node then recovers the stage by the setting's rule (CheckFree,
  CheckFree+, checkpoint rollback, ladder), as any replacement does. A replay ends when the clock reaches the
schedule's end (:meth:`Outages.over`), or earlier at ``--iterations``: a trace's window is the run's length,
and a stage with no node back before that end is waited out to it.

:class:`Outages` holds the schedule and answers from the supervisor's state (its ``schedule_clock``, the crashes
``fired``, and the slots' ``away`` / ``back_at``, checkfree.swarm.supervisor.state): which slots go down now, which
stay away, which come back. It kills nobody and waits for nothing: the supervisor does.
"""

from __future__ import annotations

import logging
from typing import Any

from checkfree.failures.traces import DOWNTIME_FORMAT, DowntimeSchedule
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.state import Slot, SupervisorState

log = logging.getLogger(__name__)


class Outages:
    """Which slots go down in an attempt, which stay away, which come back.

    Args:
        schedule: {slot: crash iterations} (the authors' node format) or a :class:`DowntimeSchedule`.
        state: the supervisor's state (its clock, the crashes fired, the slots' ``away`` / ``back_at``).
    """

    def __init__(self, schedule: dict[int, list[int]] | DowntimeSchedule, state: SupervisorState) -> None:
        self.state, self.roster = state, state.roster
        self.downtime = schedule if isinstance(schedule, DowntimeSchedule) else None
        self.crashes = schedule.node_crashes() if isinstance(schedule, DowntimeSchedule) else dict(schedule)

    @property
    def clock(self) -> int:
        """Schedule iterations elapsed (the state's ``schedule_clock``)."""
        return self.state.schedule_clock

    def due(self, it: int) -> list[Slot]:
        """The slots whose scheduled crash falls in the attempt at training iteration ``it`` (down intervals: every
        crash at or before the clock that has not fired)."""
        fired, out = self.state.fired, []
        for slot in self.roster.slots:
            times = self.crashes.get(slot.slot, [])
            if self.downtime is None:
                hit = it in times and (slot.slot, it) not in fired
            else:
                hit = any(d <= self.clock and (slot.slot, d) not in fired for d in times)
            if hit:
                out.append(slot)
        return out

    def fire(self, slot: Slot, it: int) -> int:
        """Mark ``slot``'s due crash fired; returns its schedule iteration (``it`` for crash iterations)."""
        fired = self.state.fired
        if self.downtime is None:
            fired.add((slot.slot, it))
            return it
        down = min(d for d in self.crashes[slot.slot] if d <= self.clock and (slot.slot, d) not in fired)
        fired.add((slot.slot, down))
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
        slot.kept_away(up)
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
        self.state.schedule_clock += 1

    def advance(self) -> list[tuple[Slot, int]]:
        """One schedule iteration waited (no training iteration runs): the clock moves on by one; returns the
        crashes that fall in it, each ``(slot, its schedule iteration)``, marked fired: the caller kills them, then
        brings back the slots whose up iteration came (:meth:`bring_back`)."""
        self.state.schedule_clock += 1
        return [(slot, self.fire(slot, self.clock)) for slot in self.due(self.clock)]

    def bring_back(self) -> list[Slot]:
        """Slots whose up iteration the clock reached stop being away (they get a replacement like a crashed
        slot); returns them."""
        back = [s for s in self.roster.slots if s.away and s.back_at is not None and s.back_at <= self.clock]
        for slot in back:
            slot.came_back()
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

    def over(self) -> bool:
        """The schedule's time is over (down intervals: the clock reached its last iteration): the replay ends."""
        return self.downtime is not None and self.clock >= self.downtime.iterations


def check_schedule(
    schedule: dict[int, list[int]] | DowntimeSchedule,
    cfg: SwarmConfig,
    path: str | None = None,
    swarm: str = "the swarm",
) -> None:
    """Raise ValueError (one sentence naming ``path`` and ``swarm``) when ``schedule`` names a node outside the
    swarm, or its down intervals are for another number of stages or replicas than ``cfg``'s."""
    where = f"the schedule {path}" if path else "the schedule"
    if isinstance(schedule, DowntimeSchedule):
        if (schedule.stages, schedule.replicas) != (cfg.n_stages, cfg.replicas):
            raise ValueError(
                f"{where} maps {schedule.stages} stages × {schedule.replicas} replicas, but {swarm} has "
                f"{cfg.n_stages} transformer stages × {cfg.replicas} replicas; write one for it (python "
                f"failure_generator.py --trace FILE --stages {cfg.n_stages} --replicas {cfg.replicas} --out FILE)."
            )
        return
    bad = sorted(n for n in schedule if n >= cfg.n_nodes)
    if bad:
        raise ValueError(f"{where} names node {bad[0]}, but {swarm} has nodes 0..{cfg.n_nodes - 1}.")


def schedule_info(schedule: dict[int, list[int]] | DowntimeSchedule, path: str | None) -> dict[str, Any]:
    """What throughput.json says of the schedule: its file, its format and, for down intervals, their length
    and source."""
    if isinstance(schedule, DowntimeSchedule):
        return {
            "path": path,
            "format": DOWNTIME_FORMAT,
            "iterations": schedule.iterations,
            "iteration_seconds": schedule.iteration_seconds,
            "source": schedule.source,
            "stage_losses": len(schedule.stage_losses()),
        }
    return {"path": path, "format": "node-crash-iterations" if schedule else None}
