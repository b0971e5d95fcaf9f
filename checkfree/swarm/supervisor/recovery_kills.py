"""Kills during a recovery, for soak runs: a replacement while it recovers, or its sources.

``swarm run --recovery-kills FILE`` reads kills that a crash schedule (``failure_p_configs/RATE.json``) cannot
express, because they hit nodes that exist, or matter, only while the swarm recovers::

    {"format": "checkfree-recovery-kills-v1",
     "kills": [{"iteration": 12, "kind": "replacement", "after_s": 0.2},
               {"iteration": 30, "kind": "source"}]}

While the swarm recovers from a loss during ``iteration``, once a replacement has been joined for ``after_s``
seconds (default 0) and does not serve yet, the entry fires, once:

* ``replacement``: that replacement is SIGKILLed (a replacement killed while it recovers);
* ``source``: every serving node of the first source stage of its plan is SIGKILLed (its sources die
  mid-fetch; for a copy of a live replica that is the last serving replica of its own stage). A replacement
  whose plan has no source stage with a serving node (``random``, ``storage``, a stage-0 rebuild with no copy
  holder) is passed over.

An entry whose iteration passes without such a replacement never fires. :meth:`RecoveryKills.tick` names the
victims; the supervisor kills each through :meth:`~checkfree.swarm.supervisor.processes.Processes.kill` (by pid, or
through the node's launcher) with the cause ``recovery kill: ...`` (supervisor.log), and plans it as a new loss
event before any replacement of it starts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree.swarm.supervisor.state import Roster, Slot

log = logging.getLogger(__name__)

KILLS_FORMAT = "checkfree-recovery-kills-v1"
KINDS = ("replacement", "source")


@dataclass
class RecoveryKill:
    """One kill during the recovery from a loss in ``iteration``: ``kind`` (:data:`KINDS`), ``after_s``
    seconds after a replacement joined."""

    iteration: int
    kind: str
    after_s: float = 0.0
    fired: bool = False


def _bad(path: str | Path, what: str) -> ValueError:
    return ValueError(f"recovery-kill schedule {str(path)!r} {what}.")


def load_recovery_kills(path: str | Path) -> list[RecoveryKill]:
    """Read a ``checkfree-recovery-kills-v1`` file (format above).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, another format, or an entry without a non-negative integer ``iteration``, a
            ``kind`` of :data:`KINDS` or a finite ``after_s`` ≥ 0 (one sentence naming the value).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recovery-kill schedule {str(path)!r} does not exist: expected a JSON file.")
    from checkfree.schemas.limits import MAX_SCHEDULE_BYTES, load_json

    data = load_json(path, "recovery-kill schedule", MAX_SCHEDULE_BYTES)  # 16 MiB, 32 deep: one sentence
    if (
        not isinstance(data, dict)
        or data.get("format") != KILLS_FORMAT
        or not isinstance(data.get("kills"), list)
    ):
        raise _bad(path, f'is not {{"format": "{KILLS_FORMAT}", "kills": [...]}}')
    kills = []
    for entry in data["kills"]:
        ok = isinstance(entry, dict) and set(entry) <= {"iteration", "kind", "after_s"}
        it, kind, after = (
            (entry.get("iteration"), entry.get("kind"), entry.get("after_s", 0.0)) if ok else (0, 0, 0)
        )
        if not (
            ok
            and isinstance(it, int)
            and not isinstance(it, bool)
            and it >= 0
            and kind in KINDS
            and isinstance(after, (int, float))
            and not isinstance(after, bool)
            and math.isfinite(after)
            and after >= 0
        ):
            raise _bad(
                path,
                f"has entry {str(entry)[:120]}: expected "
                '{"iteration": int >= 0, "kind": "replacement" | "source", "after_s": seconds >= 0}',
            )
        kills.append(RecoveryKill(it, kind, float(after)))
    return kills


class RecoveryKills:
    """Picks the victims of a recovery-kill schedule; :meth:`tick` runs in the recovering phase (checkfree.swarm.supervisor.phases.recovering).

    Args:
        kills: the schedule. roster: the slots (which replacement recovers, who serves which stage).
        clock: seconds (monotonic); tests replace it.
    """

    def __init__(
        self, kills: list[RecoveryKill], roster: Roster, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.kills, self.roster, self.clock = kills, roster, clock
        self.joined_at: dict[int, float] = {}
        """Recovering replacement → when this object first saw it joined."""
        self.fired: list[dict[str, Any]] = []
        """What each fired entry killed: iteration, kind, the replacement, the nodes killed."""

    def _sources(self, slot: Slot, doomed: set[int]) -> list[Slot]:
        plan = slot.plan
        if plan is None or plan.rule == "storage" or not plan.sources:
            return []
        stage = plan.sources[0]
        return [
            s
            for s in self.roster.slots
            if s.stage == stage and s.serving and not s.dead and s.slot not in doomed
        ]

    def tick(self, it: int) -> list[tuple[Slot, str]]:
        """Fire every entry of iteration ``it`` (the iteration of the loss being recovered) whose target is there
        now (recovering replacements joined ``after_s`` ago); returns the victims, each with the cause to kill it
        with, in order."""
        due = [k for k in self.kills if not k.fired and k.iteration == it]
        if not due:
            return []
        now = self.clock()
        victims_now: list[tuple[Slot, str]] = []
        doomed: set[int] = set()  # slots killed by an entry of this tick: dead for the entries after it
        recovering = [s for s in self.roster.slots if s.address is not None and not s.serving and not s.dead]
        self.joined_at = {s.occupant: self.joined_at.get(s.occupant, now) for s in recovering}
        for kill in due:
            for slot in recovering:
                if slot.dead or slot.slot in doomed or now - self.joined_at[slot.occupant] < kill.after_s:
                    continue
                victims = [slot] if kill.kind == "replacement" else self._sources(slot, doomed)
                if not victims:
                    continue
                what = (
                    "replacement while it recovers"
                    if kill.kind == "replacement"
                    else f"source of node {slot.occupant} (stage {slot.stage}) mid-fetch"
                )
                for victim in victims:
                    victims_now.append((victim, f"recovery kill: {what}"))
                    doomed.add(victim.slot)
                kill.fired = True
                self.fired.append(
                    {
                        "iteration": it,
                        "kind": kill.kind,
                        "replacement": slot.occupant,
                        "killed": [v.occupant for v in victims],
                    }
                )
                break
        return victims_now
