"""One attempt at one training iteration, as the supervisor runs it.

    begin(attempt, members) → stage-0 nodes run their pipelines → ITERATION_END from every pipeline
    → sync → every node averages its stage's gradients with its replicas → ready (grad norm)
    → commit → Adam step → committed (stats)        — the commit time is the aggregation timestamp

Scheduled crashes (checkfree.swarm.supervisor.outages: which slots, and whether a slot then stays away for a
while) fire ``crash_point`` × (last iteration time) seconds after ``begin``, while microbatches are
in flight, or at the latest when the attempt reaches ``sync`` (every pipeline's ITERATION_END is in): the
crash then fires at once, not at the estimated moment, which after a long iteration (one with a recovery)
can lie minutes past the end of the forward phase. A death in the forward phase that leaves every stage a
serving member does not abort it: every node gets ``reroute`` and the pipelines whose
route crossed the dead go again on substitutes (:meth:`Attempts.reroute`, issue 39 point 1); the dead slots are
recovered after the commit. Any other death before ``commit`` aborts the attempt everywhere (no optimizer has
stepped, so nothing is half-applied) and the iteration is redone after recovery; a stall or a timeout aborts and
retries it, at most ``max_attempts`` times.

:class:`Attempts` decides and acts at once; it waits for nothing. The supervisor's loop receives the nodes' reports
(into the state's ``reports``); the attempt phase (checkfree.swarm.supervisor.phases.attempt) asks
:meth:`Attempts.crash_due` and :meth:`Attempts.advance`, which only read the reports and move the attempt's phase,
what comes next, and returns what to do: fire the crashes, ``sync``, commit, record the commit, abort. The
supervisor's executor of those actions calls :meth:`Attempts.begin`, :meth:`Attempts.commit`,
:meth:`Attempts.abort` and :meth:`Attempts.retry`, which send. The attempt in progress
(checkfree.swarm.supervisor.state ``Attempt``) lives in the supervisor's state, so the checks of the nodes'
reports (checkfree.swarm.supervisor.inbox) can tell a report that fits it from an impossible one: a ``ready``
before ``sync``, a ``stalled`` before any microbatch can have timed out.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from checkfree.swarm.reroute import moved as reroute_moved
from checkfree.swarm.slowdown import SlowdownPlan
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.state import Attempt, SupervisorState, SwarmError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """What an attempt needs next (:meth:`Attempts.advance`): ``fire`` its due crashes now (the forward phase
    ended first; the deaths then abort it), ``sync`` (every pipeline ended: broadcast ``sync``), ``commit`` (every member is ready: the supervisor journals the
    commit's intent, then :meth:`Attempts.commit` broadcasts it), ``committed`` (with every pipeline's
    ``iteration_end`` and every node's ``ready``), or ``retry`` (it stalled: ``why``)."""

    kind: str
    why: str = ""
    ends: dict[int, dict[str, Any]] | None = None
    ready: dict[int, dict[str, Any]] | None = None


class Attempts:
    """Begins attempts at iterations and moves each through its phases.

    Args:
        state: the supervisor's state (the config and limits, the slots, the attempt in progress, its reports,
            the retry counts). link: the commands to the nodes (``begin``, ``sync``, ``commit``, ``abort``).
            slowdowns: the slowdown emulation's factors per slot and iteration (None: the config's ``slowdown``).
    """

    def __init__(self, state: SupervisorState, link: Link, slowdowns: SlowdownPlan | None = None) -> None:
        self.state, self.cfg, self.link = state, state.cfg, link
        self.slowdowns = slowdowns if slowdowns is not None else SlowdownPlan(state.cfg.slowdown)
        """Which slots compute slower from which iteration (checkfree.swarm.slowdown): sent with each ``begin``."""
        self.clock = time.monotonic
        """Seconds (monotonic); tests replace it."""

    def begin(self, it: int, due: list[int], last_wall_s: float) -> Attempt:
        """Begin the next attempt, at iteration ``it``: its reports start afresh and every member gets ``begin``.
        ``due``: the slots whose scheduled crash falls in it, killed ``crash_point`` × ``last_wall_s`` seconds
        from now (or when the forward phase ends, if that comes first)."""
        state = self.state
        state.attempt += 1
        members = state.roster.members()
        state.reports.clear()
        t_begin = self.clock()
        crash_at = t_begin + self.cfg.crash_point * last_wall_s if due else None
        deadline = t_begin + self.cfg.iteration_timeout
        state.current = Attempt(
            state.attempt,
            it,
            members,
            t_begin,
            due=due,
            crash_at=crash_at,
            deadline=deadline,
            begun={s: list(ids) for s, ids in members.items()},
        )
        members_json = {str(k): v for k, v in members.items()}
        slow = self.slowdowns.factors(it)  # slot → factor; its occupant (a replacement too) computes slower
        factors = {str(slot.occupant): slow[slot.slot] for slot in state.roster.slots if slot.slot in slow}
        extra = {"slowdown": factors} if factors else {}
        self.link.broadcast("begin", attempt=state.attempt, iteration=it, members=members_json, **extra)
        return state.current

    def _current(self) -> Attempt:
        current = self.state.current
        assert current is not None, "no attempt has begun"
        return current

    def crash_due(self, now: float) -> bool:
        """The attempt's scheduled crashes are due now (their moment came, or the attempt left the forward phase);
        once True they count as fired."""
        current = self._current()
        if current.crash_at is not None and (now >= current.crash_at or current.phase != "forward"):
            current.crash_at = None
            return True
        return False

    def advance(self) -> Step | None:
        """Move the attempt on from the reports received so far: ``sync`` once every pipeline ended (its phase is
        ``sync`` from now; the caller broadcasts it), ``commit`` once every member is ready, ``committed`` once
        every live member stepped, ``retry`` when a member reported a stall; None while it waits (the attempt's
        ``deadline`` is the caller's: checkfree.swarm.supervisor.phases.attempt). It changes only the attempt."""
        current = self._current()
        number, members, nodes = current.number, current.members, current.nodes()
        got = self.state.reports.of_attempt(number)
        by_node = self.state.roster.by_node
        alive = [n for n in nodes if not by_node[n].dead]
        pipelines = current.begun.get(0) or members.get(0, [])  # each pipeline's end, filed by its begin node
        if current.phase == "forward" and set(pipelines) <= set(got["iteration_end"]):
            if current.crash_at is not None:  # at the latest now, before the gradient exchange
                current.crash_at = None
                return Step("fire")  # the death aborts this attempt
            current.phase = "sync"
            return Step("sync")
        if current.phase == "sync" and set(nodes) <= set(got["ready"]):
            return Step("commit", ends=got["iteration_end"], ready=got["ready"])
        if current.phase == "commit" and set(alive) <= set(got["committed"]):
            return Step("committed", ends=got["iteration_end"], ready=got["ready"])
        if got["stalled"]:
            return Step("retry", f"stalled: {next(iter(got['stalled'].values()))['reason']}")
        return None

    def dead_members(self) -> list[int]:
        """The members of the attempt in progress whose node is gone (ascending)."""
        by_node = self.state.roster.by_node
        return sorted(n for n in self._current().nodes() if n in by_node and by_node[n].dead)

    def can_reroute(self, dead: list[int]) -> bool:
        """Whether the attempt in progress goes on without ``dead`` (issue 39 point 1): it is in its forward phase,
        ``dead`` are members, and every stage keeps a serving member (a dead stage-0 node's pipeline is taken over
        by another stage-0 node)."""
        current = self._current()
        if current.phase != "forward" or not dead:
            return False
        return all(set(ids) - set(dead) for ids in current.members.values())

    def reroute(self, dead: list[int]) -> None:
        """Go on without ``dead`` (:meth:`can_reroute` said so): every live node gets ``reroute`` with the serving
        lists less ``dead``; the pipelines whose route crossed them (checkfree.swarm.reroute.moved) are sent again
        by their stage-0 nodes (a substitute where that node died), and their ITERATION_END so far is stale: each
        pipeline's is filed under its stage-0 node of ``begin`` (the key :meth:`advance` awaits). The dead slots
        are recovered after the commit, as before."""
        current = self._current()
        after = {s: [n for n in ids if n not in dead] for s, ids in current.members.items()}
        moved = reroute_moved(current.begun, current.members, after, self.cfg.n_stages)
        current.members = after
        current.reroutes += 1
        ends, reported = self.state.reports.iteration_end, current.reported.get("iteration_end", set())
        for p in moved:
            key = current.begun[0][p]
            current.need_end[key] = current.reroutes
            ends.pop(key, None)
            reported.discard(key)
        log.warning(
            "supervisor: attempt %d goes on without node(s) %s: pipelines %s re-routed",
            current.number,
            dead,
            moved,
        )
        members_json = {str(k): v for k, v in after.items()}
        self.link.broadcast(
            "reroute", attempt=current.number, members=members_json, dead=dead, seq=current.reroutes
        )

    def commit(self, to: list[int] | None = None) -> None:
        """Every member is ready (:meth:`advance` said ``commit``, and the supervisor journaled the intent): the
        attempt enters its commit phase and every live node gets ``commit`` (with ``to``: only those nodes, a
        resumed supervisor finishing a commit its predecessor began; checkfree.swarm.supervisor.adoption)."""
        current = self._current()
        current.phase = "commit"
        meta: dict[str, Any] = {"attempt": current.number, "iteration": current.iteration}
        if self.state.roster.storage is not None and (current.iteration + 1) % self.cfg.checkpoint_every == 0:
            meta["checkpoint_senders"] = [ids[0] for ids in current.members.values() if ids]
        if to is None:
            self.link.broadcast("commit", **meta)
        for node in to or []:
            self.link.command(node, "commit", **meta)

    def committed(self) -> None:
        """The attempt committed its iteration: it is over, and the run counts one more commit."""
        self._current().phase = "over"
        self.state.commits += 1

    def abort(self, why: str) -> None:
        """Abort the attempt everywhere (``abort``); the iteration is redone after recovery."""
        current = self._current()
        current.phase = "over"  # later reports of this attempt are stale
        log.warning(
            "supervisor: attempt %d aborted (%s); the iteration is redone after recovery", current.number, why
        )
        self.link.broadcast("abort", attempt=current.number)

    def retry(self, why: str) -> None:
        """The attempt stalled or timed out: abort it, to be tried again.

        Raises:
            SwarmError: its iteration failed ``max_attempts`` attempts (every node is told ``abort`` first).
        """
        current = self._current()
        it, failed = current.iteration, self.state.failed_attempts
        failed[it] = failed.get(it, 0) + 1
        if failed[it] >= self.cfg.max_attempts:
            current.phase = "over"
            self.link.broadcast("abort", attempt=current.number)
            raise SwarmError(f"iteration {it} failed {self.cfg.max_attempts} attempts; last: {why}.")
        self.abort(why)
