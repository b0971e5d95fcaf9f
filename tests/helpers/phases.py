"""A supervisor's world without sockets or processes, for the phase tests (tests/swarm/supervisor/phases/): a real
state, roster, results and deciding parts, a fake link that records what is sent, and :meth:`World.turn`, which
plays one turn of the supervisor's loop (checkfree.swarm.supervisor.supervisor ``Supervisor.drive``) on a fake
clock: the phase decides, and the world carries out the actions it knows (a kill marks the slot dead, a
replacement serves at once when ``serve_at_once``), recording every action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.policies import make_policy
from checkfree.swarm.supervisor.attempts import Attempts
from checkfree.swarm.supervisor.model_io import ModelIO
from checkfree.swarm.supervisor.outages import Outages
from checkfree.swarm.supervisor.phases.base import DONE, Act, Context, Decision, Phase, Turn
from checkfree.swarm.supervisor.phases.table import PHASES
from checkfree.swarm.supervisor.planning import LossPlanner
from checkfree.swarm.supervisor.recovery_kills import RecoveryKills
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.state import Roster, SupervisorState


class FakeLink:
    """Records the commands sent: (``to`` or ``*`` for a broadcast, command, meta)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, str, dict[str, Any]]] = []

    def broadcast(self, command: str, **meta: Any) -> None:
        self.sent.append(("*", command, meta))

    def command(self, to: int, command: str, **meta: Any) -> None:
        self.sent.append((to, command, meta))

    def grant(self, slot: Any) -> None:
        pass

    def send(self, node: int, mtype: Any, meta: dict[str, Any]) -> None:
        self.sent.append((node, mtype.name, meta))

    def silent(self) -> set[int]:
        return set()

    def commands(self) -> list[str]:
        return [c for _, c, _ in self.sent]


class World:
    """A swarm of ``cfg`` under ``setting`` whose every slot serves (``schedule``: the crash schedule), on a fake
    clock ``t`` (seconds)."""

    def __init__(
        self,
        tmp_path: Path,
        setting: str = "ours",
        schedule: Any = None,
        iterations: int = 10,
        replicas: int = 1,
    ) -> None:
        cfg = SwarmConfig(model_config="tiny_config.json", replicas=replicas)
        self.cfg, self.t = cfg, 0.0
        self.policy = make_policy(setting)
        roster = Roster(cfg, 0, cfg.n_nodes, storage=self.policy.rollback_on_stage_loss)
        self.state = state = SupervisorState(cfg, setting, 300, None, roster)
        for slot in roster.all():
            slot.serving, slot.address = True, f"tcp://127.0.0.1:{9000 + slot.slot}"
            roster.by_node[slot.occupant] = slot
        self.link = FakeLink()
        self.results = Results(cfg, setting, iterations)
        self.attempts = Attempts(state, self.link)  # type: ignore[arg-type]
        self.attempts.clock = lambda: self.t
        self.planner = LossPlanner(self.policy, state, self.link)  # type: ignore[arg-type]
        self.outages = Outages(schedule or {}, state)
        from checkfree.swarm.supervisor.validation import ValidationRuns

        records, now = self.results.model, self.results.now
        validation = ValidationRuns(state, self.link, records, now)  # type: ignore[arg-type]
        model_io = ModelIO(cfg, setting, 300, self.link, tmp_path, records, now)  # type: ignore[arg-type]
        self.ctx = Context(
            state,
            self.results,
            iterations,
            self.policy,
            self.attempts,
            self.outages,
            validation,
            model_io,
            RecoveryKills([], roster),
            _NoHost(),
            self.link.silent,
            tmp_path,
            PHASES,
        )
        self.done: list[Act] = []
        """Every action carried out, in order."""
        self.serve_at_once = True
        """A replacement started serves at once (else it stays recovering)."""
        self.next_id = cfg.first_replacement_id

    def enter(self, phase: Phase) -> Decision:
        """The phase's first turn; its actions carried out."""
        self.state.phase = phase
        decision = phase.enter(self.ctx, self.t)
        self.carry_out(decision.actions)
        return decision

    def turn(self, phase: Phase, dt: float = 0.01, died: bool = False) -> Decision:
        """One later turn, ``dt`` seconds on, as the loop plays it (a step, or the expiry of a passed deadline)."""
        self.t += dt
        turn = Turn(self.t, died)
        decision = phase.step(self.ctx, turn)
        if not decision.actions and decision.next is phase and self.t > phase.ends_at(self.ctx):
            decision = phase.expired(self.ctx, turn)
        self.carry_out(decision.actions)
        return decision

    def carry_out(self, actions: list[Act]) -> None:
        for a in actions:
            self.done.append(a)
            if a.part == "link":
                getattr(self.link, a.op)(*a.args, **a.kwargs)
            elif a.part in ("attempts", "planner", "results", "validation"):
                target = {"attempts": self.attempts, "planner": self.planner, "results": self.results}
                target["validation"] = self.ctx.validation
                getattr(target[a.part], a.op)(*a.args, **a.kwargs)
            elif (a.part, a.op) == ("processes", "kill"):
                slot = a.args[0]
                slot.dead, slot.serving = True, False
                self.results.crashed(slot, a.args[1], self.state.begun_iteration)
            elif (a.part, a.op) == ("processes", "replace_dead"):
                for slot in self.state.roster.all():
                    if slot.dead and not slot.away:
                        slot.occupant, self.next_id = self.next_id, self.next_id + 1
                        slot.dead, slot.serving, slot.address = False, self.serve_at_once, None
                        self.state.roster.by_node[slot.occupant] = slot
            elif (a.part, a.op) == ("supervisor", "committed"):
                it, ends, ready = a.args
                current = self.state.current
                self.results.iteration(it, current.number, ends, ready, current.members)
                self.attempts.committed()
                self.outages.committed()
                self.state.commit_unjournaled, self.state.iteration = True, it + 1
            elif (a.part, a.op) == ("supervisor", "commit_held"):
                self.attempts.commit()
            # journal, failpoints, host, model_io and the supervisor's other records: recorded only

    def acts(self, part: str, op: str | None = None) -> list[Act]:
        """The actions carried out on ``part`` (and ``op``)."""
        return [a for a in self.done if a.part == part and (op is None or a.op == op)]

    def reports(self, kind: str, nodes: list[int], **meta: Any) -> None:
        """The nodes' reports of ``kind`` arrive (as the handlers of peer messages file them)."""
        getattr(self.state.reports, kind).update({n: dict(meta) for n in nodes})

    def nodes(self) -> list[int]:
        return [s.occupant for s in self.state.roster.slots]

    def stage0(self) -> list[int]:
        return [s.occupant for s in self.state.roster.slots if s.stage == 0]


class _NoHost:
    procs: dict[int, Any] = {}

    def exited(self, node: int) -> int | None:
        return None


def ended(decision: Decision) -> bool:
    """The decision ends the drive."""
    return decision.next is DONE
