"""What a swarm run measured, written to ``runs/<name>/throughput.json`` (docs/paper.md §8).

* ``iterations``: one row per committed iteration in execution order — iteration index, ``attempt`` (the
  number of the attempt that committed it; archived runs call it ``epoch``), ``attempts`` (the tries it took:
  1 + its attempts aborted by a death, a stall, a timeout or a resume), ``t_commit`` (seconds since the first
  ``begin``; the aggregation timestamp: every node has averaged its stage's gradients and stepped), ``wall_s``
  (= t_commit − previous t_commit, recoveries included), mean loss over pipelines (nats), tokens, per-stage
  gradient norms, ``aborted_attempts``, ``resent_microbatches`` and ``rerouted``
  (:meth:`Results.rerouted`; the re-sent microbatches from the stage-0 nodes' ITERATION_ENDs), ``routing_plan`` (checkfree.swarm.routing; not
  applied to routes yet).
* ``useful_work_fraction`` (checkfree.report.throughput_columns), ``fail_slow``
  (checkfree.swarm.supervisor.speeds).
* ``validation``, ``first_eval``, ``final_eval``, ``validation_given_up``, ``model``, ``snapshots``: the trained
  model's records (checkfree.swarm.supervisor.model_records).
* ``iterations_completed`` (net: a checkpoint rollback moves it back), ``iterations_executed``,
  ``mean_iteration_s`` (total time / executed), ``tokens_per_s`` (net tokens / total time).
* ``crashes``: per crash whose slot serves again (:class:`CrashRecord`; the others are ``open_crashes``, and
  ``crashes_count`` counts both, ``recovered_count`` the first), one recovery record of the schema the simulator
  writes too (checkfree.recovery.record): iteration, stage, rule, source stages and the nodes that sent them,
  parts, each source's weight, ω, the ladder's rung, fallback, consecutive, ``latency_s`` (crash → serving, the one
  latency key), then the replacement's fetch (lr, version, bytes, seconds) and the crash's timeline (slot, killed
  node, cause, replacement node, crash, spawn, join and serving times, ``recovery_s``, ``join_latency_s``). An
  open crash is its timeline alone. The supervisor's parts report a crash's events here (:meth:`Results.crashed`,
  :meth:`Results.spawned`, :meth:`Results.joined`, :meth:`Results.served`); the record is built and changed only by
  :class:`Results`.
* ``bytes_sent_by_type``: summed over every node (crashed nodes count up to their last commit).
* ``loss_curve``: [iteration, loss] in execution order; ``rollbacks``; ``skipped_crashes`` (no_failure).
* ``node_devices``: node id → ``cpu`` / ``cuda:N`` of every node this machine started (replacements too).
* Down-interval schedules (a preemption trace, checkfree.swarm.supervisor.outages): ``schedule`` (file, format,
  length, iteration seconds, source), ``schedule_clock`` (schedule iterations elapsed), ``replica_shortage``:
  per stage, the committed iterations it ran short of replicas and their wall seconds (``short_iterations``,
  ``short_s``), the schedule iterations and seconds the swarm waited with it lost (``waiting_iterations``,
  ``waiting_s``) and its ``losses`` (whole-stage losses recovered, with a wait or not); ``waits`` (one record per wait); ``still_away`` (slots down
  when the run ended; their crashes are under ``open_crashes``); per crash ``down_until`` (the schedule iteration
  its slot came back) and ``recovery_s`` (replacement started → serving); ``mean_recovery_s``.
* ``coordinator_outages``: one record per time the supervisor died and a resumed one took over (``swarm run
  --resume``, checkfree.swarm.supervisor.adoption): ``t_lost`` (the last word any node had from the supervisor that
  died, or its last journal write if later), ``t_resumed`` (the resumed supervisor started), ``t_adopted`` (it had
  heard every live node), ``t_next_commit`` (its first commit), ``iterations_redone`` (the iteration whose attempt
  was in flight, redone from microbatch 0), ``rolled_forward`` (the iteration whose commit the dead supervisor had
  begun and the resumed one finished), ``adopted`` and ``replaced`` (nodes, the latter with why); ``resumes``
  counts them. ``started_at``: epoch seconds of the results' clock's 0 (the first ``begin``), so a time of this
  file is ``started_at`` + t in wall time. ``journal``: what writing the supervisor's journal cost (``writes``,
  ``seconds``, ``bytes``, as of its last write).
* ``ended_by``: ``iterations`` (the target was committed) or ``schedule`` (a replayed trace's window ended
  first). ``status``: ``completed``, ``failed`` (a ``SwarmError``: a retry limit, an unrecoverable loss, an internal
  error) or ``interrupted`` (SIGINT / SIGTERM), and ``cause`` (None when completed). The file is written
  whatever ends the run (checkfree.swarm.supervisor.supervisor), with every iteration committed so far.
* ``rejected_messages``: node id → what its data-plane checks refused (``nonfinite`` and ``off_route``
  FORWARD / BACKWARD, dropped replica ``gradients``; checkfree.swarm.node.relay, .gradient_sync), as of its last
  report; ``rejected_gradients``: per committed iteration, each replica whose gradients its stage averaged
  without (iteration, attempt, stage, replica, and the replicas that reported it); ``evictions``: nodes evicted
  for misbehaving, with the cause and the evidence (checkfree.swarm.supervisor.conduct);
  ``refused_weight_requests``: node id → the weights requests it refused, per reason (``no_grant``,
  ``grant_used``, ``plan_superseded``, ``byte_cap``, and ``withheld``: over a requester's refusal budget;
  checkfree.swarm.node.parts), as of its last report; ``refused_connections``: the CURVE handshakes refused by
  the supervisor's ZAP check (``supervisor``) and by each node's (an unknown or revoked key, e.g. one made from
  another machine's join token; checkfree.swarm.wire.auth); ``machine_revocations``: the machines shut out by
  ``swarm revoke`` (machine, its nodes, the ids revoked, the slots moved to this machine, iteration, time;
  checkfree.swarm.supervisor.machines).

One concept, hence one file above 800 lines: the run's records, changed only through :class:`Results`' event
methods (tests/swarm/supervisor/test_encapsulation.py), and the table that prints them.

The file is strict JSON (checkfree.jsonio): a NaN/inf loss or gradient norm of a diverging run is ``null``,
listed under ``"nonfinite"``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.recovery.record import RecoveryRecord
from checkfree.report.throughput_columns import useful_work_fraction
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.crash_record import CrashRecord
from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Slot
from checkfree.swarm.wire.protocol import MessageType

log = logging.getLogger(__name__)


class Results:
    """Records what a run measured (the supervisor's clock, seconds); it decides nothing: the supervisor's control
    state is checkfree.swarm.supervisor.state.SupervisorState.

    Its fields are private: the supervisor and its parts report events through its methods (:meth:`iteration`,
    :meth:`aborted`, :meth:`crashed`, :meth:`evicted`, :meth:`rolled_back`, :meth:`resumed` ...), and read what they
    need through read-only properties (tests/swarm/supervisor/test_encapsulation.py checks that no code outside
    this class assigns its attributes).

    Args:
        cfg: the topology. setting: the setting's name. target: the iterations the run is to commit.
        vocab_size: the model's vocabulary (None: not known). schedule: the failure schedule's file, format and, for
            down intervals, length and source (checkfree.swarm.supervisor.outages ``schedule_info``).
        node_devices: node id → ``cpu`` / ``cuda:N`` of the nodes this machine starts; held, not copied: the host
            that starts the nodes fills it (checkfree.swarm.hosts ``LocalHost.node_devices``).
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        setting: str,
        target: int,
        vocab_size: int | None = None,
        schedule: dict[str, Any] | None = None,
        node_devices: dict[int, str] | None = None,
    ) -> None:
        self._cfg, self._setting, self._target = cfg, setting, target
        self._t0: float | None = None
        self._rows: list[dict[str, Any]] = []
        self._crashes: list[CrashRecord] = []
        """Crashes whose slot serves again, in the order they were recovered."""
        self._open: dict[int, CrashRecord] = {}
        """Slot number → its crash whose replacement does not serve yet."""
        self._skipped: list[dict[str, Any]] = []
        self._rollbacks: list[dict[str, Any]] = []
        self._reports: dict[int, dict[str, Any]] = {}
        self._finals: dict[int, dict[str, Any]] = {}
        self._aborts = 0
        self._rerouted: dict[int, int] = {}
        """Iteration → its attempts' re-routes so far (deaths that did not abort; issue 39 point 1)."""
        self._redone: dict[int, int] = {}
        """Iteration → its attempts aborted so far (a death, a stall, a timeout, a resume's attempt in flight);
        its row's ``attempts`` is one more."""
        self._rollback_bytes = 0
        self._vocab_size = vocab_size
        self._node_devices: dict[int, str] = node_devices if node_devices is not None else {}
        """node id → device of the nodes this machine started (``swarm run --device``)."""
        self._evictions: list[dict[str, Any]] = []
        """Nodes evicted for misbehaving (checkfree.swarm.supervisor.conduct), one record each."""
        self._machine_revocations: list[dict[str, Any]] = []
        """Machines shut out by ``swarm revoke`` (checkfree.swarm.supervisor.machines), one record each."""
        self._supervisor_refused_connections = 0
        """Handshakes the supervisor's ZAP check refused (an unknown or revoked key; checkfree.swarm.wire.auth)."""
        self._rejected_gradients: list[dict[str, Any]] = []
        """Replicas whose gradients a stage averaged without, per committed iteration (``ready``'s ``rejected``)."""
        self._schedule: dict[str, Any] = schedule if schedule is not None else {}
        """The failure schedule's file, format and, for down intervals, length and source."""
        self._shortage: dict[int, dict[str, float]] = {
            s: {"short_iterations": 0, "short_s": 0.0, "waiting_iterations": 0, "waiting_s": 0.0, "losses": 0}
            for s in range(cfg.n_stages + 1)
        }
        """Stage → the iterations (and seconds) it ran short of replicas, the waits with it lost, and its losses."""
        self._waits: list[dict[str, Any]] = []
        self._still_away: list[int] = []
        self._ended_by = "iterations"
        """``iterations`` (the target was committed) or ``schedule`` (a replayed trace's window ended first)."""
        self._model = ModelRecords(cfg.snapshot_every)
        """Validations, the model gathered at the end, snapshots (checkfree.swarm.supervisor.model_records)."""
        self._outages: list[dict[str, Any]] = []
        """Each time the supervisor died and a resumed one took over (module docstring)."""
        self._started_at: float | None = None
        """Epoch seconds of the results' clock's 0 (None before training started)."""
        self._journal: dict[str, float] = {}
        """What journaling cost so far (checkfree.swarm.supervisor.journal): writes, seconds, bytes."""
        self._fail_slow: list[
            dict[str, Any]
        ] = []  # nodes named fail-slow (checkfree.swarm.supervisor.speeds)

    # ------------------------------------------------------------------ what others read (read-only)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The committed iterations' rows, in execution order (module docstring: ``iterations``)."""
        return self._rows

    @property
    def crashes(self) -> list[CrashRecord]:
        """Crashes whose slot serves again, in the order they were recovered."""
        return self._crashes

    @property
    def aborts(self) -> int:
        """Attempts aborted so far (``aborted_attempts``)."""
        return self._aborts

    @property
    def redone(self) -> dict[int, int]:
        """Iteration not committed yet → its attempts aborted so far."""
        return self._redone

    @property
    def reports(self) -> dict[int, dict[str, Any]]:
        """Node → its last statistics report."""
        return self._reports

    @property
    def rejected_gradients(self) -> list[dict[str, Any]]:
        """Replicas whose gradients a stage averaged without (module docstring)."""
        return self._rejected_gradients

    @property
    def machine_revocations(self) -> list[dict[str, Any]]:
        """Machines shut out by ``swarm revoke``, one record each (:meth:`machine_revoked`)."""
        return self._machine_revocations

    @property
    def shortage(self) -> dict[int, dict[str, float]]:
        """Stage → the iterations (and seconds) it ran short of replicas, the waits with it lost, its losses."""
        return self._shortage

    @property
    def model(self) -> ModelRecords:
        """Validations, the model gathered at the end, snapshots (checkfree.swarm.supervisor.model_records)."""
        return self._model

    @property
    def started_at(self) -> float | None:
        """Epoch seconds of the results' clock's 0 (None before training started)."""
        return self._started_at

    @property
    def t0(self) -> float | None:
        """Monotonic seconds of the results' clock's 0 (None before training started)."""
        return self._t0

    # ------------------------------------------------------------------ more of what others read

    @property
    def vocab_size(self) -> int | None:
        return self._vocab_size

    @property
    def schedule(self) -> dict[str, Any]:
        return self._schedule

    @property
    def node_devices(self) -> dict[int, str]:
        return self._node_devices

    @property
    def ended_by(self) -> str:
        return self._ended_by

    @property
    def supervisor_refused_connections(self) -> int:
        return self._supervisor_refused_connections

    @property
    def rollback_bytes(self) -> int:
        return self._rollback_bytes

    @property
    def journal(self) -> dict[str, float]:
        return self._journal

    @property
    def still_away(self) -> list[int]:
        return self._still_away

    @property
    def finals(self) -> dict[int, dict[str, Any]]:
        """Node → the final statistics it answered the shutdown with (read by tests; keep)."""
        return self._finals

    @property
    def evictions(self) -> list[dict[str, Any]]:
        """Nodes evicted for misbehaving, one record each (:meth:`evicted`; read by tests; keep)."""
        return self._evictions

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return self._skipped

    @property
    def rollbacks(self) -> list[dict[str, Any]]:
        return self._rollbacks

    @property
    def outages(self) -> list[dict[str, Any]]:
        return self._outages

    # ------------------------------------------------------------------ the journal (checkfree.swarm.supervisor.journal)

    def journal_fields(self) -> dict[str, Any]:
        """Every field but the config and the clock, by its journal name (the field's name without its leading
        underscore, as the journal has always named them; the open crashes stay ``_open``)."""
        return {
            _journal_name(name): value
            for name, value in vars(self).items()
            # a function set on the object (a test's clock) is no data
            if name not in ("_cfg", "_t0") and not callable(value)
        }

    def elapsed(self) -> float | None:
        """Seconds of the results' clock now (None before training started)."""
        return self.now() if self._t0 is not None else None

    def restore(
        self, fields: dict[str, Any], decode: Callable[[Any, Any], Any], elapsed_s: float | None
    ) -> None:
        """Take back what :meth:`journal_fields` gave (a resumed supervisor's journal): each field becomes
        ``decode(its current value, its journaled value)``; the clock continues from ``elapsed_s`` seconds ago
        (None: training had not started).

        Raises:
            whatever ``decode`` raises for a value it cannot read.
        """
        for name, value in fields.items():
            attribute = _attribute(name)
            decoded = decode(getattr(self, attribute, None), value)
            if attribute == "_node_devices":  # held, not replaced: the host that starts the nodes fills it
                self._node_devices.update(decoded)
            else:
                setattr(self, attribute, decoded)
        if elapsed_s is not None:
            self._t0 = time.monotonic() - elapsed_s

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._started_at = time.time()

    def now(self) -> float:
        """Seconds since training started (negative times never occur: before start it is 0)."""
        return 0.0 if self._t0 is None else time.monotonic() - self._t0

    def reference_iteration_s(self) -> float:
        """How long one waited schedule iteration lasts: the median committed iteration so far (1 s before the
        first), so the swarm waits for a returning node as long as training those iterations would have taken."""
        return statistics.median(r["wall_s"] for r in self._rows) if self._rows else 1.0

    def waited(
        self, it: int, waited: dict[int, int], reference_s: float, seconds: float, start: int, end: int
    ) -> None:
        """The swarm waited ``seconds`` before training iteration ``it`` (schedule iterations ``start`` →
        ``end``, ``reference_s`` each), stage s lost for ``waited[s]`` of them."""
        for stage, n in waited.items():
            row = self._shortage[stage]
            row["waiting_iterations"] += n
            row["waiting_s"] += n * reference_s
        self._waits.append(
            {
                "iteration": it,
                "from": start,
                "to": end,
                "stages": sorted(waited),
                "seconds": seconds,
                "t": self.now(),
            }
        )

    def stages_lost(self, stages: set[int]) -> None:
        """A recovery begins with ``stages`` lost (no serving replica): one whole-stage loss each."""
        for stage in stages:
            self._shortage[stage]["losses"] += 1

    def last_wall_s(self) -> float:
        """The previous iteration's wall time (1 s before the first), for placing a crash mid-iteration."""
        return self._rows[-1]["wall_s"] if self._rows else 1.0

    def iteration(
        self,
        it: int,
        attempt: int,
        ends: dict[int, dict],
        ready: dict[int, dict],
        members: dict[int, list[int]],
    ) -> None:
        """Iteration ``it`` committed in attempt number ``attempt``: ``ends`` (stage-0 node → its ITERATION_END
        meta: loss, tokens), ``ready`` (node → its ``ready``: grad norm, replicas dropped), ``members`` (stage →
        the nodes that served it). Its row's ``attempts`` counts the tries it took: the attempts at ``it``
        :meth:`aborted` reported, plus this one. Its ``loss`` is the mean of the pipelines' losses added in
        pipeline order (``members[0]``), not in the order the ITERATION_ENDs came: the same bits run to run."""
        t = self.now()
        prev = self._rows[-1]["t_commit"] if self._rows else 0.0
        stage_of = {n: s for s, ids in members.items() for n in ids}
        norms: dict[str, float] = {}
        rejected: dict[tuple[int, int], list[int]] = {}  # (stage, replica) → the replicas that dropped it
        for node, meta in ready.items():
            norms.setdefault(str(stage_of[node]), float(meta["grad_norm"]))
            for replica in meta.get("rejected", []):
                rejected.setdefault((stage_of[node], replica), []).append(node)
        for (stage, replica), by in sorted(rejected.items()):
            self._rejected_gradients.append(
                {
                    "iteration": it,
                    "attempt": attempt,
                    "stage": stage,
                    "replica": replica,
                    "reported_by": sorted(by),
                }
            )
            log.warning(
                "supervisor: iteration %d: stage %d averaged without node %d's gradients (reported by %s)",
                it,
                stage,
                replica,
                sorted(by),
            )
        wall = t - prev
        for stage, ids in members.items():
            if (
                0 < len(ids) < self._cfg.replicas
            ):  # a stage short of replicas: its live ones carry every pipeline
                self._shortage[stage]["short_iterations"] += 1
                self._shortage[stage]["short_s"] += wall
        pipeline = {n: i for i, n in enumerate(members.get(0, []))}
        in_order = sorted(  # never arrival order; a pipeline taken over names itself (``pipeline``)
            ends, key=lambda n: (int(ends[n].get("pipeline", pipeline.get(n, len(pipeline)))), n)
        )
        losses = [float(ends[n]["loss"]) for n in in_order]
        aborted = self._redone.pop(it, 0)
        self._rows.append(
            {
                "iteration": it,
                "attempt": attempt,
                "attempts": 1 + aborted,
                "aborted_attempts": aborted,
                "resent_microbatches": sum(int(m.get("resent", 0)) for m in ends.values()),
                "rerouted": self._rerouted.pop(it, 0),
                "routing_plan": None,
                "t_commit": t,
                "wall_s": wall,
                "loss": sum(losses) / len(losses),
                "tokens": sum(int(m["tokens"]) for m in ends.values()),
                "grad_norms": norms,
            }
        )

    def rerouted(self, it: int) -> None:
        """A death during an attempt at iteration ``it`` re-routed it instead of aborting it (issue 39 point 1):
        counted in ``rerouted`` of ``it``'s row once it commits (its ``resent_microbatches``: the microbatches
        the stage-0 nodes sent again, from their ITERATION_ENDs)."""
        self._rerouted[it] = self._rerouted.get(it, 0) + 1

    def planned(self, plan: dict[str, Any] | None, fail_slow: list[dict[str, Any]]) -> None:
        """The last committed iteration's routing plan (checkfree.swarm.routing ``RoutingPlan.to_json``: shares,
        bound, plan and fixed-route seconds) goes in its row's ``routing_plan``; ``fail_slow``: the nodes named
        fail-slow at it (checkfree.swarm.supervisor.speeds), added to ``fail_slow``."""
        if self._rows:
            self._rows[-1]["routing_plan"] = plan
        self._fail_slow.extend(fail_slow)

    def aborted(self, it: int) -> None:
        """An attempt at iteration ``it`` was aborted (it is redone): counted in ``aborted_attempts`` and in the
        ``attempts`` of ``it``'s row once it commits."""
        self._aborts += 1
        self._redone[it] = self._redone.get(it, 0) + 1

    # ------------------------------------------------------------------ run events

    def skipped_crash(self, slot: Slot, iteration: int) -> None:
        """The schedule's crash of ``slot`` during ``iteration`` was skipped (``no_failure`` kills nobody):
        a row of ``skipped_crashes``."""
        self._skipped.append({"slot": slot.slot, "stage": slot.stage, "iteration": iteration})

    def rolled_back(self, at_iteration: int, to_iteration: int, lost_stages: set[int], nbytes: int) -> None:
        """A loss at ``at_iteration`` (``lost_stages`` without a serving replica) rolled the swarm back to the
        checkpoint of ``to_iteration``, restoring ``nbytes`` bytes: a row of ``rollbacks``, added to
        ``rollback_bytes``."""
        self._rollback_bytes += nbytes
        self._rollbacks.append(
            {
                "at_iteration": at_iteration,
                "to_iteration": to_iteration,
                "lost_stages": sorted(lost_stages),
                "t": self.now(),
            }
        )

    def evicted(
        self,
        node: int,
        slot: Slot | None,
        iteration: int,
        cause: str,
        rejected_by_supervisor: int,
        reported_by: dict[int, int],
        replaced: bool,
    ) -> None:
        """``node`` (occupying ``slot``; None: no slot's) was evicted for misbehaving during ``iteration``
        (checkfree.swarm.supervisor.conduct): ``cause``, the messages the supervisor refused of it, reporter →
        the messages each refused, and whether its slot gets a replacement (``replaced``). A row of
        ``evictions``."""
        self._evictions.append(
            {
                "node": node,
                "slot": slot.slot if slot is not None else None,
                "stage": slot.stage if slot is not None else None,
                "iteration": iteration,
                "t": self.now(),
                "cause": cause,
                "rejected_by_supervisor": rejected_by_supervisor,
                "reported_by": {str(r): n for r, n in sorted(reported_by.items())},
                "replaced": replaced,
            }
        )

    def machine_revoked(self, record: dict[str, Any]) -> None:
        """A machine was shut out (``swarm revoke``): its record of ``machine_revocations``
        (checkfree.swarm.supervisor.machines ``Revocations.revoke``)."""
        self._machine_revocations.append(record)

    def resumed(
        self,
        resume: int,
        last_word_wall: float,
        t_resumed: float,
        from_iteration: int,
        iterations_redone: list[int],
        rolled_forward: int | None,
        adopted: list[int],
        replaced: dict[int, str],
        stale_messages_dropped: int,
    ) -> None:
        """A resumed supervisor (number ``resume``, started at ``t_resumed``) heard every live node now: a row of
        ``coordinator_outages`` (module docstring). ``last_word_wall``: epoch seconds of the last word any node had
        from the supervisor that died (or its last journal write); ``iterations_redone``: the iteration whose
        attempt was in flight (``[it]``, or ``[]``); ``rolled_forward``: the iteration whose commit it finished (its
        ``t_next_commit`` is now), None if none; ``replaced``: node → why."""
        started, now = self._started_at, self.now()
        self._outages.append(
            {
                "resume": resume,
                "t_lost": last_word_wall - started if started is not None else None,
                "t_resumed": t_resumed,
                "t_adopted": now,
                "t_next_commit": now if rolled_forward is not None else None,
                "from_iteration": from_iteration,
                "iterations_redone": iterations_redone,
                "rolled_forward": rolled_forward,
                "adopted": sorted(adopted),
                "replaced": {str(n): why for n, why in sorted(replaced.items())},
                "stale_messages_dropped": stale_messages_dropped,
            }
        )

    def next_commit_after_resume(self) -> None:
        """An iteration committed: the first after the last resume sets that outage's ``t_next_commit``."""
        if self._outages and self._outages[-1]["t_next_commit"] is None:
            self._outages[-1]["t_next_commit"] = self.now()

    def ended_by_schedule(self) -> None:
        """A replayed trace's window ended before the target was committed (``ended_by``: ``schedule``)."""
        self._ended_by = "schedule"

    def away_at_end(self, slots: list[int]) -> None:
        """The run ended with ``slots`` kept down by the schedule (``still_away``)."""
        self._still_away = list(slots)

    def final_reports(self, finals: dict[int, dict[str, Any]]) -> None:
        """Node → the final statistics it answered the shutdown with."""
        self._finals = finals

    def refused_connections(self, n: int) -> None:
        """The supervisor's ZAP check has refused ``n`` handshakes so far (``refused_connections.supervisor``)."""
        self._supervisor_refused_connections = n

    def journal_cost(self, writes: int, seconds: float, nbytes: int) -> None:
        """Writing the supervisor's journal has cost ``writes`` writes, ``seconds`` and ``nbytes`` so far
        (``journal``)."""
        self._journal = {"writes": writes, "seconds": seconds, "bytes": nbytes}

    # ------------------------------------------------------------------ crash events, by slot

    def _crash(self, slot: Slot, cause: str, iteration: int) -> None:
        self._open[slot.slot] = CrashRecord(
            slot.slot, slot.occupant, slot.stage, iteration, cause, self.now()
        )

    def crashed(self, slot: Slot, cause: str, iteration: int) -> None:
        """``slot``'s node is gone during ``iteration``. A slot's crash is recorded once: a replacement lost
        before it serves belongs to the same crash."""
        if slot.slot not in self._open:
            self._crash(slot, cause, iteration)

    def scheduled_kill(self, slot: Slot, iteration: int) -> None:
        """The crash schedule kills ``slot``'s node now, during ``iteration``."""
        self._crash(slot, "scheduled SIGKILL", iteration)

    def kept_away(self, slot: Slot) -> None:
        """The schedule keeps ``slot`` down until ``slot.back_at`` (checkfree.swarm.supervisor.outages)."""
        crash = self._open.get(slot.slot)
        if crash is not None:
            crash.away, crash.down_until = True, slot.back_at

    def forget_crash(self, slot: Slot) -> None:
        """An initial node failed to start: its restart is a plain retry, not a crash."""
        self._open.pop(slot.slot, None)

    def open_crash(self, slot: Slot) -> CrashRecord | None:
        """``slot``'s crash whose replacement does not serve yet, or None."""
        return self._open.get(slot.slot)

    def spawned(self, slot: Slot) -> None:
        """A node was started for ``slot`` (its occupant): a crashed slot's replacement."""
        crash = self._open.get(slot.slot)
        if crash is not None:
            crash.replacement_node, crash.t_spawn = slot.occupant, self.now()

    def joined(self, slot: Slot) -> None:
        """``slot``'s occupant joined the swarm."""
        crash = self._open.get(slot.slot)
        if crash is not None:
            crash.t_join = self.now()

    def served(self, slot: Slot, record: dict[str, Any], background: bool = False) -> CrashRecord | None:
        """``slot``'s occupant serves, rebuilt per ``record`` (the node's recovery record, schema-checked on the
        wire); returns the crash this closes (now in :attr:`crashes`), or None when the slot had none open. With
        ``background`` (it recovered while the others trained, issue 39 point 3) the record's ``background_s``
        is its replacement's start → joining the swarm, seconds."""
        crash = self._open.pop(slot.slot, None)
        if crash is None:
            return None
        crash.t_serving = self.now()
        crash.recovery, crash.consecutive = RecoveryRecord.from_json(record), slot.consecutive
        if background and crash.recovery_s is not None:
            crash.recovery.extra["background_s"] = crash.recovery_s
        self._crashes.append(crash)
        return crash

    # ------------------------------------------------------------------ node statistics and the file

    def node_report(self, node: int, meta: dict[str, Any]) -> None:
        self._reports[node] = meta

    def bytes_by_type(self) -> dict[str, int]:
        out = {t.name: 0 for t in MessageType}
        for meta in self._reports.values():
            for name, n in meta.get("sent_bytes", {}).items():
                out[name] = out.get(name, 0) + int(n)
        return out

    def compute(self) -> dict[str, dict[str, float]]:
        return {str(n): m["compute"] for n, m in self._reports.items() if "compute" in m}

    def finish(
        self, run_dir: Path, status: str = "completed", cause: str | None = None, schedule_clock: int = 0
    ) -> dict[str, Any]:
        """Write ``run_dir/throughput.json`` (strict JSON) and return its content.

        Args:
            status: ``completed``, ``failed`` or ``interrupted``; cause: why it did not complete (None if it did).
            schedule_clock: schedule iterations elapsed (down-interval schedules: committed + waited iterations).

        Raises:
            OSError: the file cannot be written.
        """
        total = self._rows[-1]["t_commit"] if self._rows else 0.0
        completed = self._rows[-1]["iteration"] + 1 if self._rows else 0
        walls = [r["wall_s"] for r in self._rows]
        crash_iters = {c.iteration for c in self._crashes} | {r["at_iteration"] for r in self._rollbacks}
        quiet = [r["wall_s"] for r in self._rows if r["iteration"] not in crash_iters]
        crashed = crash_iters | {c.iteration for c in self._open.values()}
        clean = [r["wall_s"] for r in self._rows if r["iteration"] not in crashed and r["attempts"] == 1]
        latencies = [c.latency_s for c in self._crashes if c.latency_s is not None]
        recoveries = [c.recovery_s for c in self._crashes if c.recovery_s is not None]
        out = {
            "status": status,
            "cause": cause,
            "setting": self._setting,
            "nodes": self._cfg.n_nodes,
            "stages": self._cfg.n_stages + 1,
            "replicas": self._cfg.replicas,
            "microbatches": self._cfg.mb_count,
            "in_flight": self._cfg.in_flight,
            "time_scale": self._cfg.time_scale,
            "iterations_target": self._target,
            "ended_by": self._ended_by,
            "iterations_completed": completed,
            "iterations_executed": len(self._rows),
            "total_s": total,
            "mean_iteration_s": total / len(self._rows) if self._rows else None,
            "median_iteration_s": statistics.median(walls) if walls else None,
            "mean_iteration_s_without_crashes": statistics.mean(quiet) if quiet else None,
            "tokens_per_s": completed * self._cfg.tokens_per_iteration() / total if total else None,
            "crashes_count": len(self._crashes) + len(self._open),  # open: not served again (yet)
            "recovered_count": len(latencies),
            "mean_crash_to_serving_s": statistics.mean(latencies) if latencies else None,
            "mean_recovery_s": statistics.mean(recoveries) if recoveries else None,
            "aborted_attempts": self._aborts,
            "useful_work_fraction": useful_work_fraction(clean, walls),
            "fail_slow": self._fail_slow,
            "crashes": [c.to_json() for c in self._crashes],
            "open_crashes": [c.to_json() for c in self._open.values()],
            "skipped_crashes": self._skipped,
            "rollbacks": self._rollbacks,
            "rollback_bytes": self._rollback_bytes,
            "bytes_sent_by_type": self.bytes_by_type(),
            "loss_curve": [[r["iteration"], r["loss"]] for r in self._rows],
            "iterations": self._rows,
            "node_compute": self.compute(),
            "malformed_dropped": {str(n): m.get("dropped_malformed", 0) for n, m in self._reports.items()},
            "rejected_messages": {str(n): m["rejected"] for n, m in self._reports.items() if "rejected" in m},
            "refused_weight_requests": {
                str(n): m["refused_requests"] for n, m in self._reports.items() if m.get("refused_requests")
            },
            "refused_connections": {
                "supervisor": self._supervisor_refused_connections,
                **{
                    str(n): m["refused_connections"]
                    for n, m in self._reports.items()
                    if m.get("refused_connections")
                },
            },
            "machine_revocations": self._machine_revocations,
            "rejected_gradients": self._rejected_gradients,
            "evictions": self._evictions,
            "vocab_size": self._vocab_size,
            "node_devices": {str(n): d for n, d in self._node_devices.items()},
            "schedule": self._schedule,
            "schedule_clock": schedule_clock,
            "replica_shortage": {str(s): row for s, row in self._shortage.items()},
            "waits": self._waits,
            "still_away": self._still_away,
            "coordinator_outages": self._outages,
            "resumes": len(self._outages),
            "started_at": self._started_at,
            "journal": self._journal,
            **self._model.to_json(self._rows),
            "config": self._cfg.to_json(),
        }
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "throughput.json").write_text(jsonio.dumps(out, indent=1))
        return out

    def finish_early(self, run_dir: Path, status: str, cause: str, schedule_clock: int = 0) -> None:
        """:meth:`finish` for a run that stops before its last iteration (``failed`` or ``interrupted``):
        throughput.json with every iteration committed so far. A failure to write it is logged, not raised:
        the error that stopped the run is the one to report."""
        try:
            self.finish(run_dir, status, cause, schedule_clock)
        except OSError as exc:
            log.error("supervisor: could not write %s: %s", Path(run_dir) / "throughput.json", exc)
            return
        log.info("supervisor: %s run; %d committed iterations in %s", status, len(self._rows), run_dir)


def _journal_name(attribute: str) -> str:
    """A field's name in the journal (:meth:`Results.journal_fields`)."""
    return attribute if attribute == "_open" else attribute.removeprefix("_")


def _attribute(journal_name: str) -> str:
    """The field a journal name restores (the inverse of :func:`_journal_name`)."""
    return journal_name if journal_name == "_open" else f"_{journal_name}"
