"""The supervisor: bootstrap/rendezvous, iteration coordinator, crash replayer, result collector (docs/paper.md §8).

It starts one process per *slot* (initial node ids START..END−1; a slot = a stage replica at a location),
plus the storage node for ``checkpoint``. Each node JOINs at the supervisor's address (the bootstrap), gets
WELCOME (config, peers) and the others get the new peer table. Then, per iteration, one *epoch* per attempt:

    begin(epoch, members) → stage-0 nodes run their pipelines → ITERATION_END from every pipeline
    → sync → every node averages its stage's gradients with its replicas → ready (grad norm)
    → commit → Adam step → committed (stats)        — the commit time is the aggregation timestamp

**Crashes.** ``failure_p_configs/RATE.json`` lists, per initial node id (= slot), the iterations in which it
crashes. During the first attempt of iteration i, ``crash_point`` × (last iteration time) seconds after
``begin`` — microbatches are then in flight — the supervisor SIGKILLs the slot's current process (all
replicas of a stage at once when the schedule says so: a whole-stage failure), or at the latest when the
attempt reaches ``sync``. ``no_failure`` logs the scheduled crashes and kills nobody. A schedule of slot down
intervals (a real preemption trace) keeps a crashed slot away until it comes back: its stage trains on the
replicas left, and a stage with none left is waited for (checkfree.swarm.supervisor.outages: ``Outages``).

**In-flight microbatches.** A death noticed before ``commit`` aborts the epoch everywhere (``abort``): every
node drops that epoch's activations and accumulated gradients, and stale messages are dropped by their epoch.
No optimizer has stepped before ``commit``, so nothing is half-applied. The slot gets a replacement (a new
node id, same stage and location) which recovers its weights from the network per the setting
(checkfree.swarm.policies); when every slot serves again, the same iteration is redone from microbatch 0
with the same batches (the data position is the iteration). So no microbatch is lost or counted twice.
A death after ``commit`` was broadcast no longer aborts: the survivors step, and the replacement copies
the stepped state. Under ``checkpoint``, a whole-stage loss rolls every node back to the newest checkpoint
that every stage stored, and the iterations since are redone.

**Re-planning.** The supervisor plans each loss event once, for every slot without a serving node, and sends
the plan in the replacement's WELCOME. When a later loss event changes the plan of a stage whose replacement
is already recovering, or a replacement reports that every source of its plan is gone (CONTROL ``replan``),
it plans that stage again from the stages that serve now and sends the new plan (CONTROL ``plan``) to every
replacement of the stage still recovering: replicas of one stage are rebuilt by one plan, and a replacement
never waits on a dead source (checkfree.swarm.node.recovering). A lost stage 0 is planned from a copy holder
(stage 1 or S) only once a serving node of it reported holding its copy (``committed``); else that part takes
the random-init fallback at once.

**Parts.** The slots and messages to nodes (checkfree.swarm.supervisor.roster: ``Roster``, ``Link``), the
node processes and their deaths (checkfree.swarm.supervisor.processes: ``Processes``), the checkpoints and
rollback (checkfree.swarm.supervisor.checkpoints: ``Checkpoints``), the attempt loop
(checkfree.swarm.supervisor.attempts: ``Attempts``), the handlers of peer messages
(checkfree.swarm.supervisor.inbox: ``PeerMessages``) and the measurements with their crash records
(checkfree.swarm.supervisor.results: ``Results``) and the soak runs' kills during recoveries
(checkfree.swarm.supervisor.recovery_kills: ``RecoveryKills``, ``swarm run --recovery-kills``) and the evidence
against misbehaving nodes with their eviction (checkfree.swarm.supervisor.conduct: ``Conduct``) are small objects
wired here, and public: tests drive them directly. This module plans each loss event and runs the whole:
start, iterate, recover, shut down.

**No hang.** Every wait has a deadline and a next step: attempt (``iteration_timeout``, a ``stalled``
report) → abort and redo, at most ``max_attempts`` times per iteration; replacement (``recovery_timeout``,
``recovery_failed``) → kill and start another, at most ``max_attempts`` times per slot; shutdown → SIGKILL.
Exceeding a limit raises :class:`SwarmError`. Every process is reaped in ``finally``; nodes exit by
themselves when the supervisor falls silent. Processes are killed by pid only.
"""

from __future__ import annotations

import logging
import secrets
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.failures.traces import DOWNTIME_FORMAT, DowntimeSchedule
from checkfree.recovery.planner import RecoveryImpossible, RecoveryPlan
from checkfree.swarm.config import SwarmConfig, node_range
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.launcher import LAUNCHER_ID_BASE
from checkfree.swarm.policies import make_recovery
from checkfree.swarm.supervisor.attempts import Attempts
from checkfree.swarm.supervisor.checkpoints import Checkpoints
from checkfree.swarm.supervisor.conduct import Conduct
from checkfree.swarm.supervisor.inbox import PeerMessages
from checkfree.swarm.supervisor.outages import Outages
from checkfree.swarm.supervisor.processes import Processes
from checkfree.swarm.supervisor.recovery_kills import RecoveryKill, RecoveryKills
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.roster import Link, Roster, Slot, SwarmError
from checkfree.swarm.wire import control as schemas
from checkfree.swarm.wire.auth import KeyRing, SwarmKeys
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.wire.transport import Transport

__all__ = ["Slot", "Supervisor", "SwarmError"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 15.0


class Supervisor:
    """Runs a swarm to ``iterations`` committed iterations; :meth:`run` returns the throughput results.

    Args:
        cfg: the topology. setting: no_failure | checkpoint | ours | ours-plus. schedule: {node id: crash
        iterations} (checkfree.failures.schedules.load_node_schedule), or slot down intervals replayed from a
        preemption trace (checkfree.failures.traces.DowntimeSchedule; checkfree.swarm.supervisor.outages).
        run_dir: logs and throughput.json go here. schedule_path: the schedule's file, for throughput.json.
        start, end: the initial node ids this machine starts (others join from elsewhere at ``address``).
        on_recovered: called as ``on_recovered(supervisor, crash_records)`` after every recovery, while the
        swarm is paused, with the recovered crashes as throughput.json lists them (tests inspect weights
        through :meth:`fetch_weights`).
        recovery_kills: kills during recoveries (soak runs; checkfree.swarm.supervisor.recovery_kills).
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        setting: str,
        schedule: dict[int, list[int]] | DowntimeSchedule,
        iterations: int,
        run_dir: Path,
        vocab_size: int,
        start: int = 0,
        end: int | None = None,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        cache_dir: Path | None = None,
        on_recovered: Callable[[Supervisor, list[dict[str, Any]]], None] | None = None,
        insecure: bool = False,
        recovery_kills: list[RecoveryKill] | None = None,
        schedule_path: str | None = None,
    ) -> None:
        self.cfg, self.setting, self.iterations = cfg, setting, iterations
        self.strategy = make_recovery(setting)
        self.run_dir, self.vocab_size, self.on_recovered = Path(run_dir), vocab_size, on_recovered
        end = node_range(cfg.n_nodes, start, end)
        check_schedule(schedule, cfg)
        self.schedule = schedule
        self.roster = Roster(cfg, start, end, storage=self.strategy.rollback_on_stage_loss)
        self.outages = Outages(schedule, self.roster)
        self.keys = None if insecure else SwarmKeys.new()
        identity = None
        if self.keys is not None:
            ring = KeyRing({n: self.keys.public_key(n) for n in range(-1, cfg.first_replacement_id)})
            launchers = range(LAUNCHER_ID_BASE, LAUNCHER_ID_BASE + cfg.n_nodes)
            ring.update({n: self.keys.public_key(n) for n in launchers})
            identity = self.keys.identity(SUPERVISOR_ID, ring)
        self.transport = Transport(
            SUPERVISOR_ID,
            bind_host=bind_host,
            port=port,
            heartbeat_interval=cfg.heartbeat_interval,
            peer_timeout=cfg.peer_timeout,
            identity=identity,
            validate=schemas.check_counting(lambda msg, exc: self.conduct.refused(msg, exc)),
        )
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.host = LocalHost(
            self.run_dir, self.address, bind_host, advertise_host, cache_dir, keys=self.keys
        )
        self.results = Results(cfg, setting, iterations)
        self.results.vocab_size = vocab_size
        self.results.schedule = schedule_info(schedule, schedule_path)
        self.results.schedule_clock = lambda: self.outages.clock
        self.link = Link(self.transport, self.roster)
        self.checkpoints = Checkpoints(cfg, self.roster, self.link)
        self.processes = Processes(
            cfg, self.roster, self.link, self.host, self.results, self.checkpoints, self.keys, self.address
        )
        self.attempts = Attempts(
            cfg, self.strategy, self.outages, self.roster, self.link, self.processes, self.results
        )
        self.conduct = Conduct(self.roster, self.link, self.processes, self.results, self.keys)
        self.peer_messages = PeerMessages(
            cfg,
            setting,
            vocab_size,
            self.keys,
            self.roster,
            self.link,
            self.checkpoints,
            self.processes,
            self.results,
            self.attempts,
            self.conduct,
        )
        self.link.handle = self.peer_messages.handle
        self.link.police = self.conduct.enforce
        self.recovery_kills = RecoveryKills(recovery_kills or [], self.roster, self.processes, self.results)

    @property
    def token_path(self) -> Path:
        """The join token other machines' launchers need (written by :meth:`run`; absent with ``insecure``)."""
        return self.run_dir / "join_token.json"

    # ------------------------------------------------------------------ public

    def run(self) -> dict[str, Any]:
        """Start, train, shut down; returns (and writes) the throughput results.

        Raises:
            SwarmError: a retry limit was exceeded, or an internal error (a bug) stopped the run: its
                traceback is appended to ``<run_dir>/supervisor.log``. Every node is reaped either way, and
                throughput.json is written with ``"status": "failed"`` and the cause (``"interrupted"`` on a
                KeyboardInterrupt: SIGINT, or SIGTERM through checkfree.cli), holding the committed iterations.
        """
        try:
            return self._run()
        except SwarmError as exc:
            self.results.finish_early(self.run_dir, "failed", str(exc))
            raise
        except KeyboardInterrupt as exc:
            self.results.finish_early(self.run_dir, "interrupted", str(exc) or "SIGINT")
            raise
        except Exception as exc:  # a bug: stop the run, keep the traceback, reap every node (finally below)
            with open(self.run_dir / "supervisor.log", "a") as f:
                f.write(f"internal error of the supervisor:\n{traceback.format_exc()}")
            error = SwarmError(
                f"internal error of the supervisor ({type(exc).__name__}: {exc}); traceback in "
                f"{self.run_dir / 'supervisor.log'}."
            )
            self.results.finish_early(self.run_dir, "failed", str(error))
            raise error from exc
        finally:
            self.host.reap_all()
            self.transport.close()

    def _run(self) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.keys is not None:
            self.keys.write_token(self.token_path, self.address)
        for slot in self.roster.all():
            if slot.local:
                self.processes.spawn(slot, replacement=False)
        for _ in self.processes.wait_serving(initial=True):
            pass  # the initial start has no loss events to plan
        if self.roster.storage is not None:
            self.checkpoints.store_initial()
        self.results.start()
        it = 0
        while it < self.iterations:
            it = self._ensure_serving(it)
            if self.outages.over():  # a replayed trace's window is over
                self.results.ended_by = "schedule"
                log.warning(
                    "supervisor: the schedule's %d iterations are over after %d committed iterations; the run ends",
                    self.outages.clock,
                    it,
                )
                break
            if self.attempts.attempt(it):
                it += 1
        self._shutdown()
        return self.results.finish(self.run_dir)

    def fetch_weights(self, node: int, stage: int, timeout: float = 30.0, part: str | None = None) -> Message:
        """Ask a serving node for its stage's weights (w.* tensors, meta with grad_norm), or, with ``part``, for
        the CheckFree+ copy of stage 0's "embedding" or "head" it holds; for tests."""
        rid = secrets.token_hex(16)
        self.link.send(
            node,
            MessageType.WEIGHTS_REQUEST,
            {"stage": stage, "request": rid} | ({"part": part} if part else {}),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.transport.recv(0.05)
            if msg is None:
                continue
            if msg.type == MessageType.WEIGHTS_RESPONSE and msg.meta.get("request") == rid:
                return msg
            self.peer_messages.handle(msg)
        raise SwarmError(f"node {node} did not answer a weights request within {timeout:.0f} s.")

    def node_address(self, node: int) -> str | None:
        slot = self.roster.by_node.get(node)
        return slot.address if slot is not None else None

    def write_config(self) -> None:
        (self.run_dir / "swarm_config.json").write_text(jsonio.dumps(self.cfg.to_json(), indent=1))

    # ------------------------------------------------------------------ loss events

    def _plan(self, stage: int, lost: set[int]) -> RecoveryPlan:
        """The plan of a replacement of ``stage`` when ``lost`` have no serving replica (a lost stage 0 only
        from the copy holders that hold their copy).

        Raises:
            SwarmError: the setting cannot recover a lost stage (e.g. stage 0 under ``ours``).
        """
        try:
            return self.strategy.plan(stage, lost, self.cfg.n_stages, holding=self.roster.holding_stages())
        except RecoveryImpossible as exc:
            raise SwarmError(str(exc)) from None

    def _assign(self, slot: Slot, plan: RecoveryPlan, force: bool = False) -> None:
        """Make ``plan`` the slot's plan; a replacement that joined and still recovers gets it (CONTROL
        ``plan``) when it changed, or with ``force`` (it asked for one)."""
        changed, slot.plan = plan != slot.plan, plan
        if (changed or force) and slot.address is not None and not slot.serving and not slot.dead:
            slot.plan_seq += 1
            members = {str(k): v for k, v in self.roster.members().items()}
            self.link.grant(slot)  # its sources may answer it under this plan
            self.link.command(slot.occupant, "plan", plan=plan.to_json(), members=members, seq=slot.plan_seq)
            log.info(
                "supervisor: node %d (stage %d) gets plan %d: %s from stages %s%s",
                slot.occupant,
                slot.stage,
                slot.plan_seq,
                plan.rule,
                list(plan.sources),
                f" ({plan.fallback})" if plan.fallback else "",
            )

    def _plan_event(self, lost: set[int]) -> None:
        """Plan, once for this loss event (``lost``: the stages with no serving replica), how every slot
        without a serving node is rebuilt. Replacements execute these plans and never re-plan themselves; a
        recovering replacement whose plan this event changes is sent the new one, so replicas of one stage
        lost together are rebuilt alike, whatever order they join in.

        Raises:
            SwarmError: the setting cannot recover a lost stage (e.g. stage 0 under ``ours``).
        """
        for slot in self.roster.slots:
            if not slot.serving and not slot.away:
                self._assign(slot, self._plan(slot.stage, lost))

    def _answer_replans(self) -> None:
        """A recovering replacement whose sources are all gone asked for a new plan: plan its stage again from
        the stages that serve now, for every replacement of that stage (the asker gets it in any case)."""
        for node, meta in sorted(self.link.inbox.pop("replan", {}).items()):
            slot = self.roster.by_node.get(node)
            if (
                slot is None
                or slot.occupant != node
                or slot.serving
                or slot.dead
                or meta["seq"] < slot.plan_seq
            ):
                continue  # gone, serving, or a newer plan is on its way to it already
            log.warning("supervisor: node %d asks for a new plan: %s", node, meta["reason"][:200])
            slot.replans += 1  # at most max_attempts answers (checkfree.swarm.supervisor.inbox)
            plan = self._plan(slot.stage, self.roster.lost_stages())
            for other in self.roster.slots:
                if other.stage == slot.stage and not other.serving:
                    self._assign(other, plan, force=other is slot)

    def _recovery_tick(self) -> None:
        """Between polls while the swarm recovers: answer requests for a new plan, fire due recovery kills."""
        self._answer_replans()
        self.recovery_kills.tick()

    def _idle(self, seconds: float) -> None:
        """Serve messages and notice deaths for ``seconds`` (while the swarm waits for a returning node)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.link.poll(min(0.02, max(0.0, deadline - time.monotonic())))
            self.processes.check_deaths()

    def _wait_for_returns(self, it: int) -> None:
        """A stage whose every replica the schedule keeps away is lost: wait, as the schedule's time passes,
        until a node of it comes back (checkfree.swarm.supervisor.outages); its replacement then recovers the
        stage by the setting's rule."""
        stranded = self.outages.stranded()
        if not stranded:
            return
        reference = self.results.reference_iteration_s()
        log.warning(
            "supervisor: stages %s lost with every replica down (schedule iteration %d); waiting for a node to "
            "come back, %.3f s per schedule iteration",
            stranded,
            self.outages.clock,
            reference,
        )
        waited, seconds, start = self.outages.wait_for_returns(
            reference, self._idle, lambda slot, down: self.attempts.crash(slot, it, down)
        )
        self.results.waited(it, waited, reference, seconds, start, self.outages.clock)
        log.warning(
            "supervisor: waited %.1f s (schedule iterations %d → %d) for stages %s",
            seconds,
            start,
            self.outages.clock,
            sorted(waited),
        )

    def _ensure_serving(self, it: int) -> int:
        """Bring back the slots whose down interval ended, wait while a stage has no replica left to come back,
        then recover every dead slot before the next attempt; returns the iteration to run (rollback!)."""
        self.outages.bring_back()
        self._wait_for_returns(it)
        if self.roster.all_serving() or self.outages.over():
            return it
        lost = self.roster.lost_stages()
        self.results.stages_lost(lost)
        self._plan_event(lost)
        rollback = bool(lost) and self.strategy.rollback_on_stage_loss

        def check_rollback() -> None:  # raises once no checkpoint every stage stored is left
            if rollback and not self.checkpoints.has_complete():
                cause = self.checkpoints.missing_cause()
                raise SwarmError(f"stages {sorted(lost)} were lost and cannot be rolled back: {cause}.")

        def tick() -> None:
            check_rollback()  # the storage node died during this recovery: its checkpoints went with it
            self._recovery_tick()

        check_rollback()
        pending = {c.node for c in map(self.results.open_crash, self.roster.slots) if c is not None}
        for new_loss in self.processes.wait_serving(tick=tick):
            self._plan_event(new_loss)  # before any replacement of this loss starts
            if new_loss and self.strategy.rollback_on_stage_loss and not rollback:
                rollback, lost = True, new_loss  # a stage lost while a partial loss recovers
                check_rollback()
        if rollback:
            version = self.checkpoints.newest_complete()
            self.results.rollback_bytes += self.checkpoints.rollback(version, self.processes.check_deaths)
            self.results.rollbacks.append(
                {
                    "at_iteration": it,
                    "to_iteration": version,
                    "lost_stages": sorted(lost),
                    "t": self.results.now(),
                }
            )
            it = version
        for slot in self.roster.all():  # the storage node's too: its restarts are not one failing start
            slot.tries = 0
        if self.on_recovered is not None:
            self.on_recovered(self, [c.to_json() for c in self.results.crashes if c.node in pending])
        return it

    def _shutdown(self) -> None:
        self.results.still_away = [s.slot for s in self.roster.slots if s.away]
        self.link.inbox.clear()
        self.link.broadcast("shutdown")
        expected = {s.occupant for s in self.roster.all() if not s.dead}
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while not expected <= set(self.link.reported("final")) and time.monotonic() < deadline:
            self.link.poll(0.02)
        missing = expected - set(self.link.reported("final"))
        if missing:
            log.warning("supervisor: no final stats from nodes %s", sorted(missing))
        self.results.finals = self.link.reported("final")
        for launcher in self.roster.launchers:
            self.link.command(launcher, "shutdown")
        self.host.wait_all(timeout=10.0)


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
