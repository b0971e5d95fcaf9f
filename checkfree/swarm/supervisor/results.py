"""What a swarm run measured, written to ``runs/<name>/throughput.json`` (docs/paper.md §8).

* ``iterations``: one row per committed iteration in execution order — iteration index, ``attempt`` (the
  number of the attempt that committed it; archived runs call it ``epoch``), ``attempts`` (the tries it took:
  1 + its attempts aborted by a death, a stall, a timeout or a resume), ``t_commit`` (seconds since the first
  ``begin``; the aggregation timestamp: every node has averaged its stage's gradients and stepped), ``wall_s``
  (= t_commit − previous t_commit, recoveries included), mean loss over pipelines (nats), tokens, per-stage
  gradient norms.
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

The file is strict JSON (checkfree.jsonio): a NaN/inf loss or gradient norm of a diverging run is ``null``,
listed under ``"nonfinite"``.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.recovery.record import RecoveryRecord
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Slot
from checkfree.swarm.wire.protocol import MessageType

log = logging.getLogger(__name__)


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


class Results:
    """Records what a run measured (the supervisor's clock, seconds); it decides nothing: the supervisor's control
    state is checkfree.swarm.supervisor.state.SupervisorState."""

    def __init__(self, cfg: SwarmConfig, setting: str, target: int) -> None:
        self.cfg, self.setting, self.target = cfg, setting, target
        self.t0: float | None = None
        self.rows: list[dict[str, Any]] = []
        self.crashes: list[CrashRecord] = []
        """Crashes whose slot serves again, in the order they were recovered."""
        self._open: dict[int, CrashRecord] = {}
        """Slot number → its crash whose replacement does not serve yet."""
        self.skipped: list[dict[str, Any]] = []
        self.rollbacks: list[dict[str, Any]] = []
        self.reports: dict[int, dict[str, Any]] = {}
        self.finals: dict[int, dict[str, Any]] = {}
        self.aborts = 0
        self.redone: dict[int, int] = {}
        """Iteration → its attempts aborted so far (a death, a stall, a timeout, a resume's attempt in flight);
        its row's ``attempts`` is one more."""
        self.rollback_bytes = 0
        self.vocab_size: int | None = None
        self.node_devices: dict[int, str] = {}
        """node id → device of the nodes this machine started (``swarm run --device``)."""
        self.evictions: list[dict[str, Any]] = []
        """Nodes evicted for misbehaving (checkfree.swarm.supervisor.conduct), one record each."""
        self.machine_revocations: list[dict[str, Any]] = []
        """Machines shut out by ``swarm revoke`` (checkfree.swarm.supervisor.machines), one record each."""
        self.supervisor_refused_connections = 0
        """Handshakes the supervisor's ZAP check refused (an unknown or revoked key; checkfree.swarm.wire.auth)."""
        self.rejected_gradients: list[dict[str, Any]] = []
        """Replicas whose gradients a stage averaged without, per committed iteration (``ready``'s ``rejected``)."""
        self.schedule: dict[str, Any] = {}
        """The failure schedule's file, format and, for down intervals, length and source (set by the supervisor)."""
        self.shortage: dict[int, dict[str, float]] = {
            s: {"short_iterations": 0, "short_s": 0.0, "waiting_iterations": 0, "waiting_s": 0.0, "losses": 0}
            for s in range(cfg.n_stages + 1)
        }
        """Stage → the iterations (and seconds) it ran short of replicas, the waits with it lost, and its losses."""
        self.waits: list[dict[str, Any]] = []
        self.still_away: list[int] = []
        self.ended_by = "iterations"
        """``iterations`` (the target was committed) or ``schedule`` (a replayed trace's window ended first)."""
        self.model = ModelRecords(cfg.snapshot_every)
        """Validations, the model gathered at the end, snapshots (checkfree.swarm.supervisor.model_records)."""
        self.outages: list[dict[str, Any]] = []
        """Each time the supervisor died and a resumed one took over (module docstring)."""
        self.started_at: float | None = None
        """Epoch seconds of the results' clock's 0 (None before training started)."""
        self.journal: dict[str, float] = {}
        """What journaling cost so far (checkfree.swarm.supervisor.journal): writes, seconds, bytes."""

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.started_at = time.time()

    def now(self) -> float:
        """Seconds since training started (negative times never occur: before start it is 0)."""
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def reference_iteration_s(self) -> float:
        """How long one waited schedule iteration lasts: the median committed iteration so far (1 s before the
        first), so the swarm waits for a returning node as long as training those iterations would have taken."""
        return statistics.median(r["wall_s"] for r in self.rows) if self.rows else 1.0

    def waited(
        self, it: int, waited: dict[int, int], reference_s: float, seconds: float, start: int, end: int
    ) -> None:
        """The swarm waited ``seconds`` before training iteration ``it`` (schedule iterations ``start`` →
        ``end``, ``reference_s`` each), stage s lost for ``waited[s]`` of them."""
        for stage, n in waited.items():
            row = self.shortage[stage]
            row["waiting_iterations"] += n
            row["waiting_s"] += n * reference_s
        self.waits.append(
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
            self.shortage[stage]["losses"] += 1

    def last_wall_s(self) -> float:
        """The previous iteration's wall time (1 s before the first), for placing a crash mid-iteration."""
        return self.rows[-1]["wall_s"] if self.rows else 1.0

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
        :meth:`aborted` reported, plus this one."""
        t = self.now()
        prev = self.rows[-1]["t_commit"] if self.rows else 0.0
        stage_of = {n: s for s, ids in members.items() for n in ids}
        norms: dict[str, float] = {}
        rejected: dict[tuple[int, int], list[int]] = {}  # (stage, replica) → the replicas that dropped it
        for node, meta in ready.items():
            norms.setdefault(str(stage_of[node]), float(meta["grad_norm"]))
            for replica in meta.get("rejected", []):
                rejected.setdefault((stage_of[node], replica), []).append(node)
        for (stage, replica), by in sorted(rejected.items()):
            self.rejected_gradients.append(
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
                0 < len(ids) < self.cfg.replicas
            ):  # a stage short of replicas: its live ones carry every pipeline
                self.shortage[stage]["short_iterations"] += 1
                self.shortage[stage]["short_s"] += wall
        losses = [float(m["loss"]) for m in ends.values()]
        self.rows.append(
            {
                "iteration": it,
                "attempt": attempt,
                "attempts": 1 + self.redone.pop(it, 0),
                "t_commit": t,
                "wall_s": wall,
                "loss": sum(losses) / len(losses),
                "tokens": sum(int(m["tokens"]) for m in ends.values()),
                "grad_norms": norms,
            }
        )

    def aborted(self, it: int) -> None:
        """An attempt at iteration ``it`` was aborted (it is redone): counted in ``aborted_attempts`` and in the
        ``attempts`` of ``it``'s row once it commits."""
        self.aborts += 1
        self.redone[it] = self.redone.get(it, 0) + 1

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

    def served(self, slot: Slot, record: dict[str, Any]) -> CrashRecord | None:
        """``slot``'s occupant serves, rebuilt per ``record`` (the node's recovery record, schema-checked on the
        wire); returns the crash this closes (now in :attr:`crashes`), or None when the slot had none open."""
        crash = self._open.pop(slot.slot, None)
        if crash is None:
            return None
        crash.t_serving = self.now()
        crash.recovery, crash.consecutive = RecoveryRecord.from_json(record), slot.consecutive
        self.crashes.append(crash)
        return crash

    # ------------------------------------------------------------------ node statistics and the file

    def node_report(self, node: int, meta: dict[str, Any]) -> None:
        self.reports[node] = meta

    def bytes_by_type(self) -> dict[str, int]:
        out = {t.name: 0 for t in MessageType}
        for meta in self.reports.values():
            for name, n in meta.get("sent_bytes", {}).items():
                out[name] = out.get(name, 0) + int(n)
        return out

    def compute(self) -> dict[str, dict[str, float]]:
        return {str(n): m["compute"] for n, m in self.reports.items() if "compute" in m}

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
        total = self.rows[-1]["t_commit"] if self.rows else 0.0
        completed = self.rows[-1]["iteration"] + 1 if self.rows else 0
        walls = [r["wall_s"] for r in self.rows]
        crash_iters = {c.iteration for c in self.crashes} | {r["at_iteration"] for r in self.rollbacks}
        quiet = [r["wall_s"] for r in self.rows if r["iteration"] not in crash_iters]
        latencies = [c.latency_s for c in self.crashes if c.latency_s is not None]
        recoveries = [c.recovery_s for c in self.crashes if c.recovery_s is not None]
        out = {
            "status": status,
            "cause": cause,
            "setting": self.setting,
            "nodes": self.cfg.n_nodes,
            "stages": self.cfg.n_stages + 1,
            "replicas": self.cfg.replicas,
            "microbatches": self.cfg.mb_count,
            "in_flight": self.cfg.in_flight,
            "time_scale": self.cfg.time_scale,
            "iterations_target": self.target,
            "ended_by": self.ended_by,
            "iterations_completed": completed,
            "iterations_executed": len(self.rows),
            "total_s": total,
            "mean_iteration_s": total / len(self.rows) if self.rows else None,
            "median_iteration_s": statistics.median(walls) if walls else None,
            "mean_iteration_s_without_crashes": statistics.mean(quiet) if quiet else None,
            "tokens_per_s": completed * self.cfg.tokens_per_iteration() / total if total else None,
            "crashes_count": len(self.crashes) + len(self._open),  # open: not served again (yet)
            "recovered_count": len(latencies),
            "mean_crash_to_serving_s": statistics.mean(latencies) if latencies else None,
            "mean_recovery_s": statistics.mean(recoveries) if recoveries else None,
            "aborted_attempts": self.aborts,
            "crashes": [c.to_json() for c in self.crashes],
            "open_crashes": [c.to_json() for c in self._open.values()],
            "skipped_crashes": self.skipped,
            "rollbacks": self.rollbacks,
            "rollback_bytes": self.rollback_bytes,
            "bytes_sent_by_type": self.bytes_by_type(),
            "loss_curve": [[r["iteration"], r["loss"]] for r in self.rows],
            "iterations": self.rows,
            "node_compute": self.compute(),
            "malformed_dropped": {str(n): m.get("dropped_malformed", 0) for n, m in self.reports.items()},
            "rejected_messages": {str(n): m["rejected"] for n, m in self.reports.items() if "rejected" in m},
            "refused_weight_requests": {
                str(n): m["refused_requests"] for n, m in self.reports.items() if m.get("refused_requests")
            },
            "refused_connections": {
                "supervisor": self.supervisor_refused_connections,
                **{
                    str(n): m["refused_connections"]
                    for n, m in self.reports.items()
                    if m.get("refused_connections")
                },
            },
            "machine_revocations": self.machine_revocations,
            "rejected_gradients": self.rejected_gradients,
            "evictions": self.evictions,
            "vocab_size": self.vocab_size,
            "node_devices": {str(n): d for n, d in self.node_devices.items()},
            "schedule": self.schedule,
            "schedule_clock": schedule_clock,
            "replica_shortage": {str(s): row for s, row in self.shortage.items()},
            "waits": self.waits,
            "still_away": self.still_away,
            "coordinator_outages": self.outages,
            "resumes": len(self.outages),
            "started_at": self.started_at,
            "journal": self.journal,
            **self.model.to_json(self.rows),
            "config": self.cfg.to_json(),
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
        log.info("supervisor: %s run; %d committed iterations in %s", status, len(self.rows), run_dir)


def summary_table(results: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per run: setting, iterations, crashes/recovered, times, loss, the last validation
    loss (perplexity) and the iteration it was measured at (— without a validation); and, when a run
    replayed down intervals (a preemption trace), a second table: per run the stage losses, the seconds spent
    short of replicas and waiting for a lost stage's node, recovery time and the slots still down at the end."""
    head = (
        "| setting | iterations (executed) | crashes | recovered | mean iteration s | w/o crashes s | "
        "crash→serving s | tokens/s | first → last loss | val loss (perplexity) @ iteration |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        curve = r["loss_curve"]
        lat = r["mean_crash_to_serving_s"]
        lines.append(
            f"| {r['setting']} | {r['iterations_completed']} ({r['iterations_executed']}) | {r['crashes_count']} | "
            f"{r['recovered_count']} | {_f(r['mean_iteration_s'])} | {_f(r['mean_iteration_s_without_crashes'])} | "
            f"{_f(lat)} | {_f(r['tokens_per_s'], 0)} | "
            f"{_f(curve[0][1] if curve else None)} → {_f(curve[-1][1] if curve else None)} | {_val(r)} |"
        )
    traced = [r for r in results if (r.get("schedule") or {}).get("format") == "checkfree-slot-downtime-v1"]
    if traced:
        lines += [
            "",
            "Trace replays (per run, summed over stages): stage losses = whole-stage losses recovered; short = "
            "committed iterations (and their seconds) a stage ran on fewer replicas; waiting = schedule iterations "
            "(and seconds) the swarm waited with a stage lost; recovery = replacement started → serving.",
            "",
            "| setting | trace | schedule iterations | stage losses | short iterations (s) | waiting iterations (s) "
            "| recovery s | slots down at the end |",
            "|" + "---|" * 8,
        ]
        for r in traced:
            shortage = (r.get("replica_shortage") or {}).values()
            total = {k: sum(row.get(k, 0) for row in shortage) for k in _SHORTAGE_KEYS}
            source = r["schedule"].get("source") or {}
            lines.append(
                f"| {r['setting']} | {source.get('trace', r['schedule'].get('path'))} | "
                f"{r.get('schedule_clock')} of {r['schedule'].get('iterations')} | {total['losses']} | "
                f"{total['short_iterations']} ({_f(total['short_s'], 1)}) | "
                f"{total['waiting_iterations']} ({_f(total['waiting_s'], 1)}) | {_f(r.get('mean_recovery_s'))} | "
                f"{r.get('still_away') or '—'} |"
            )
    return "\n".join(lines)


_SHORTAGE_KEYS = ("losses", "short_iterations", "short_s", "waiting_iterations", "waiting_s")


def _val(result: dict[str, Any]) -> str:
    """The last validation of a run: "loss (perplexity) @ iteration", or — (none, or an older throughput.json)."""
    last = result.get("final_eval")
    if not isinstance(last, dict):
        return "—"
    return f"{_f(last.get('val_loss'))} ({_f(last.get('perplexity'), 2)}) @ {last.get('iteration')}"


def _f(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"
