"""One crash of a slot's node as throughput.json records it (checkfree.swarm.supervisor.results: ``crashes`` and
``open_crashes``); built and changed only by :class:`~checkfree.swarm.supervisor.results.Results`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from checkfree.recovery.record import RecoveryRecord


@dataclass
class CrashRecord:
    """One loss of a slot's node, from the crash until a replacement serves the slot again.

    Times are seconds on the results' clock (:meth:`Results.now`).

    Attributes:
        slot, node, stage: the slot, the node that was lost, and its stage.
        iteration: the iteration during which it was lost.
        cause: why ("scheduled SIGKILL", "process exited with code -9", …).
        t_crash: when it was lost (or killed, for a scheduled crash).
        replacement_node, t_spawn: the last replacement started for the slot, and when (None: none yet).
        t_join: when that replacement joined (None: not yet).
        t_serving: when the slot served again (None: not yet).
        recovery: the recovery record the replacement reported with ``serving`` (checkfree.swarm.node.recovering);
            its stage, iteration, consecutive and latency are the supervisor's, set when it is written.
        consecutive: a directly adjacent stage was lost in the loss event the slot's plan came from.
        away, down_until: the schedule kept the slot down until schedule iteration ``down_until`` (None: to the
            end of the schedule) before its replacement started.
    """

    slot: int
    node: int
    stage: int
    iteration: int
    cause: str
    t_crash: float
    replacement_node: int | None = None
    t_spawn: float | None = None
    t_join: float | None = None
    t_serving: float | None = None
    recovery: RecoveryRecord | None = None
    consecutive: bool = False
    away: bool = False
    down_until: int | None = None

    @property
    def latency_s(self) -> float | None:
        """Crash → serving, seconds (None while the slot does not serve again)."""
        return None if self.t_serving is None else self.t_serving - self.t_crash

    @property
    def recovery_s(self) -> float | None:
        """Replacement started → serving, seconds (None while the slot does not serve again)."""
        if self.t_serving is None or self.t_spawn is None:
            return None
        return self.t_serving - self.t_spawn

    def timeline(self) -> dict[str, Any]:
        """The crash's events: slot, killed node, cause, times (a key appears once its event happened)."""
        out: dict[str, Any] = {
            "slot": self.slot,
            "node": self.node,
            "cause": self.cause,
            "t_crash": self.t_crash,
        }
        if self.away:
            out["down_until"] = self.down_until
        if self.t_spawn is not None:
            out |= {"replacement_node": self.replacement_node, "t_spawn": self.t_spawn}
        if self.t_join is not None:
            out["t_join"] = self.t_join
        if self.t_serving is not None:
            out |= {"t_serving": self.t_serving, "recovery_s": self.recovery_s}
            if self.t_join is not None:
                out["join_latency_s"] = self.t_join - self.t_crash
        return out

    def to_json(self) -> dict[str, Any]:
        """The row of ``crashes`` (the recovery record, then the fetch and the timeline) or, while the slot does not
        serve again, of ``open_crashes`` (stage, iteration and the timeline)."""
        if self.t_serving is None or self.recovery is None:
            out = {"stage": self.stage, "iteration": self.iteration, **self.timeline()}
            return out | ({"latency_s": self.latency_s} if self.t_serving is not None else {})
        record = dataclasses.replace(
            self.recovery,
            stage=self.stage,
            iteration=self.iteration,
            strategy=None,  # throughput.json names the setting once
            consecutive=self.consecutive,
            latency_s=self.latency_s,
            extra={**self.recovery.extra, **self.timeline()},
        )
        return record.to_json()
