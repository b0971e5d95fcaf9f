"""The supervisor: bootstrap, iteration coordinator, crash replayer and result collector (docs/paper.md §8), as
one loop over explicit phases.

It starts one process per *slot* (initial node ids START..END−1; a slot = a stage replica at a location),
plus the storage node for ``checkpoint``. Each node JOINs at the supervisor's address (the bootstrap), gets
WELCOME (config, peers) and the others get the new peer table. Then, per iteration, one attempt after another
until one commits (checkfree.swarm.supervisor.attempts):

    begin(attempt, members) → stage-0 nodes run their pipelines → ITERATION_END from every pipeline
    → sync → every node averages its stage's gradients with its replicas → ready (grad norm)
    → commit → Adam step → committed (stats)        — the commit time is the aggregation timestamp

**Crashes.** ``failure_p_configs/RATE.json`` lists, per initial node id (= slot), the iterations in which it
crashes. During the first attempt of iteration i, ``crash_point`` × (last iteration time) seconds after
``begin`` — microbatches are then in flight — the supervisor SIGKILLs the slot's current process (all
replicas of a stage at once when the schedule says so: a whole-stage failure), or at the latest when the
attempt reaches ``sync``. ``no_failure`` logs the scheduled crashes and kills nobody. A schedule of slot down
intervals (a real preemption trace) keeps a crashed slot away until it comes back: its stage trains on the
replicas left, and a stage with none left is waited for (checkfree.swarm.supervisor.outages).

**In-flight microbatches.** A death in the forward phase that leaves every stage a serving replica re-routes
the attempt instead (``reroute``: only the pipelines that crossed the dead node go
again, on substitutes; checkfree.swarm.supervisor.attempts ``Attempts.reroute``, issue 39 point 1), and the dead
slot is recovered after the commit. Any other death noticed before ``commit`` aborts the attempt everywhere (``abort``): every
node drops that attempt's activations and accumulated gradients, and stale messages are dropped by their
attempt number. No optimizer has stepped before ``commit``, so nothing is half-applied. The slot gets a
replacement (a new node id, same stage and location) which recovers its weights from the network by the plan the
supervisor made for it (checkfree.swarm.supervisor.planning, the setting's rules in checkfree.swarm.policies);
when every slot serves again, the same iteration is redone from microbatch 0 with the same batches (the data
position is the iteration). So no microbatch is lost or counted twice. A death after ``commit`` was broadcast no
longer aborts: the survivors step, and the replacement copies the stepped state. Under ``checkpoint``, a
whole-stage loss rolls every node back to the newest checkpoint that every stage stored, and the iterations since
are redone.

**One loop over explicit phases.** Everything the supervisor decides from is one
:class:`~checkfree.swarm.supervisor.state.SupervisorState` (the slots and their occupants and plans, the
iteration, the attempt in progress, the schedule's clock, the retry counts, the reports received, the checkpoints
stored, the commit intent, and the phase the loop is in); :class:`~checkfree.swarm.supervisor.results.Results`
only records what happened, for throughput.json. :meth:`Supervisor.drive` is the loop, and the only place of the
supervisor package that receives messages: receive (each message routed to the handlers of peer messages,
checkfree.swarm.supervisor.inbox, which file the reports in the state), notice deaths, let the phase decide
(checkfree.swarm.supervisor.phases: starting, attempt, recovering, rolling back, validating, resuming, … one file
each), carry out the actions it returns (:meth:`Supervisor.carry_out`: send, kill, start, journal, record), repeat.
A phase never waits nor sends; each wait is the loop turning in one phase until its reports are in or its deadline
(one mechanism: the phase's ``ends_at``) has passed. This module is that loop, the executor of the actions, the
construction and the public API; the parts act or decide at once and never wait, nor call back into the
supervisor: the node processes (checkfree.swarm.supervisor.processes), the messages to nodes (.link), the
attempt's bookkeeping (.attempts), the schedule's replay (.outages), the loss-event planning (.planning), the
handlers of peer messages (.inbox, which return what the processes must do), the evidence against misbehaving
nodes (.conduct, which names whom to evict), the soak runs' kills during recoveries (.recovery_kills, ``swarm run
--recovery-kills``). The phases are tested without sockets (tests/swarm/supervisor/phases/), given a state, reports
and a clock.

**The model.** At iteration 0, every ``eval_interval`` iterations and at the end the pipeline is validated on the
model config's fixed validation batches, forward only (checkfree.swarm.supervisor.validation); with
``snapshot_every`` a snapshot of every stage's weights and Adam state is fetched and written in the background while
training goes on; and however the run ends, one serving replica per stage sends its weights to ``<run_dir>/model/``
(checkfree.swarm.supervisor.model_io).

**No hang.** Every wait has a deadline and a next step: attempt (``iteration_timeout``, a ``stalled``
report) → abort and redo, at most ``max_attempts`` times per iteration; replacement (``recovery_timeout``,
``recovery_failed``) → kill and start another, at most ``max_attempts`` times per slot; shutdown → SIGKILL.
Exceeding a limit raises :class:`SwarmError`. Every process is reaped in ``finally``. Processes are killed by pid
only.

**The supervisor can die and come back.** It journals its state (checkfree.swarm.supervisor.journal) at every
commit, before it broadcasts one (the commit's intent), around every node start (pid and start time) and before a
scheduled crash fires. Nodes whose supervisor falls silent keep their state and wait ``supervisor_grace`` seconds
(checkfree.swarm.node.supervisor_watch). ``swarm run --resume`` builds a supervisor from the journal
(:meth:`Supervisor.restore`: load the journaled state); its :meth:`run` enters the resuming phase, which re-adopts
the live nodes (the verdicts of checkfree.swarm.supervisor.adoption), finishes or redoes what was in flight, then
goes on in the phase the journal was in.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.failures.traces import DowntimeSchedule
from checkfree.swarm.config import SwarmConfig, node_range
from checkfree.swarm.devices import DeviceMap
from checkfree.swarm.hosts import LocalHost, held_signals
from checkfree.swarm.policies import make_policy
from checkfree.swarm.slowdown import SlowdownPlan, SlowEvent
from checkfree.swarm.supervisor import failpoints
from checkfree.swarm.supervisor.adoption import CommitIntent, ResumeImpossible
from checkfree.swarm.supervisor.attempts import Attempts
from checkfree.swarm.supervisor.conduct import Conduct
from checkfree.swarm.supervisor.inbox import Action, PeerMessages
from checkfree.swarm.supervisor.journal import Journal, JournalError, JournalSources, decode_results
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.machines import Revocations, revoked_before, token_path
from checkfree.swarm.supervisor.model_io import ModelIO
from checkfree.swarm.supervisor.outages import Outages, check_schedule, schedule_info
from checkfree.swarm.supervisor.phases.base import DONE, Act, Context, Phase, Turn
from checkfree.swarm.supervisor.phases.fetching_weights import FetchingWeights
from checkfree.swarm.supervisor.phases.gathering import GatheringModel
from checkfree.swarm.supervisor.phases.resuming import Resuming
from checkfree.swarm.supervisor.phases.starting import Starting
from checkfree.swarm.supervisor.phases.table import PHASES
from checkfree.swarm.supervisor.planning import LossPlanner
from checkfree.swarm.supervisor.processes import Processes
from checkfree.swarm.supervisor.recovery_kills import RecoveryKill, RecoveryKills
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.speeds import Speeds
from checkfree.swarm.supervisor.state import Roster, Slot, SupervisorState, SwarmError
from checkfree.swarm.supervisor.validation import ValidationRuns
from checkfree.swarm.wire import control as schemas
from checkfree.swarm.wire.auth import KeyRing, MachineLayout, SwarmKeys
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.wire.transport import Transport

__all__ = ["Slot", "Supervisor", "SwarmError"]

log = logging.getLogger(__name__)


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
        keys: the swarm's keys (None: a new secret; a resumed supervisor passes its journal's,
        checkfree.swarm.supervisor.journal.keys_of). journal: write ``<run_dir>/journal.json`` (False: only
        ``bench_swarm.py``, which measures its cost). options: what ``swarm run`` was started with (journaled:
        ``--resume`` reads them). machines: the other machines' node ranges (``--machines``). devices: this
        machine's nodes' devices (``--device``/``--gpus``, checkfree.swarm.devices; None: the CPU). slowdowns: the
        schedule's slowdown events (checkfree.swarm.slowdown ``load_slowdowns``; None: the config's alone).
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
        keys: SwarmKeys | None = None,
        journal: bool = True,
        options: dict[str, Any] | None = None,
        machines: list[tuple[int, int]] | None = None,
        devices: DeviceMap | None = None,
        slowdowns: list[SlowEvent] | None = None,
    ) -> None:
        self.cfg, self.setting = cfg, setting
        self.policy = make_policy(setting)
        self.run_dir, self.on_recovered = Path(run_dir), on_recovered
        end = node_range(cfg.n_nodes, start, end)
        check_schedule(schedule, cfg)
        keys = None if insecure else (keys if keys is not None else SwarmKeys.new())
        roster = Roster(cfg, start, end, storage=self.policy.rollback_on_stage_loss)
        self.state = SupervisorState(cfg, setting, vocab_size, keys, roster)
        self.conduct = Conduct(roster)
        identity = None
        if keys is not None:  # every id gets its key from its machine's secret (checkfree.swarm.wire.auth)
            keys.set_layout(MachineLayout(cfg.n_nodes, cfg.first_replacement_id, (start, end), machines))
            keys.layout.revoked |= revoked_before(self.run_dir)  # a resumed run's revoked machines stay out
            ring = KeyRing({n: keys.public_key(n) for n in range(-1, cfg.first_replacement_id)})
            ring.update({m.launcher: keys.public_key(m.launcher) for m in keys.layout.remote()})
            identity = keys.identity(SUPERVISOR_ID, ring)
        self.transport = Transport(
            SUPERVISOR_ID,
            bind_host=bind_host,
            port=port,
            heartbeat_interval=cfg.heartbeat_interval,
            peer_timeout=cfg.peer_timeout,
            identity=identity,
            validate=schemas.check_counting(self.conduct.refused),
        )
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.host = LocalHost(
            self.run_dir, self.address, bind_host, advertise_host, cache_dir, keys=keys, devices=devices
        )
        self.results = Results(  # the host fills node_devices as it starts nodes
            cfg,
            setting,
            iterations,
            vocab_size,
            schedule_info(schedule, schedule_path),
            self.host.node_devices,
        )
        self.link = Link(self.transport, roster)
        self.outages = Outages(schedule, self.state)
        self.options = options or {}
        self.port = int(self.transport.address.rsplit(":", 1)[1])
        self.recovery_kills = RecoveryKills(recovery_kills or [], roster)
        sources = JournalSources(
            self.state,
            self.results,
            self.host,
            self.options,
            self.address,
            self.port,
            self.recovery_kills.kills,
        )
        self.journal = Journal(self.run_dir, sources, enabled=journal)
        """``<run_dir>/journal.json``: what a resumed supervisor starts from (checkfree.swarm.supervisor.journal)."""
        self.processes = Processes(
            self.state, self.link, self.host, self.results, self.address, journal=self.journal
        )
        self.attempts = Attempts(self.state, self.link, SlowdownPlan(cfg.slowdown, slowdowns))
        m = cfg.model
        self.speeds = Speeds(cfg.location_table(), cfg.time_scale, m.batch_size * m.seq_l * m.dmodel * 4)
        """Per-node speed estimates, the routing plan and fail-slow nodes (checkfree.swarm.supervisor.speeds)."""
        self.planner = LossPlanner(self.policy, self.state, self.link)
        self.peer_messages = PeerMessages(self.state, self.link, self.results, self.conduct)
        records, now = self.results.model, self.results.now  # validations, the model, snapshots
        self.validation = ValidationRuns(self.state, self.link, records, now)
        self.model_io = ModelIO(cfg, setting, vocab_size, self.link, self.run_dir, records, now, cache_dir)
        self.peer_messages.node_handlers[MessageType.WEIGHTS_RESPONSE] = self.model_io.on_weights
        self.peer_messages.node_commands["evaluated"] = self.validation.on_evaluated
        self.revocations = Revocations(self.state, self.link, self.processes, self.results, self.run_dir)
        """Machines shut out while the run goes on (``swarm revoke``; checkfree.swarm.supervisor.machines)."""
        self.context = Context(
            self.state,
            self.results,
            iterations,
            self.policy,
            self.attempts,
            self.outages,
            self.validation,
            self.model_io,
            self.recovery_kills,
            self.host,
            self.link.silent,
            self.run_dir,
            PHASES,
        )
        """What the phases read and ask (checkfree.swarm.supervisor.phases.base)."""

    @property
    def iterations(self) -> int:
        """The target: iterations to commit (the phases read it; a test lowers it to end a running swarm)."""
        return self.context.iterations

    @iterations.setter
    def iterations(self, value: int) -> None:
        self.context.iterations = value

    @property
    def roster(self) -> Roster:
        """The slots and their occupants (the state's)."""
        return self.state.roster

    def token_paths(self) -> dict[int, Path]:
        """Machine START → the join token its launcher needs (written by :meth:`run`; none with ``insecure``)."""
        keys = self.state.keys
        if keys is None or keys.layout is None:
            return {}
        return {m.start: token_path(self.run_dir, m.start) for m in keys.layout.remote()}

    # ------------------------------------------------------------------ public

    def run(self) -> dict[str, Any]:
        """Start (or resume), train, shut down; returns (and writes) the throughput results.

        Raises:
            SwarmError: a retry limit was exceeded, or an internal error (a bug) stopped the run: its
                traceback is appended to ``<run_dir>/supervisor.log``. Every node is reaped either way, and
                throughput.json is written with ``"status": "failed"`` and the cause (``"interrupted"`` on a
                KeyboardInterrupt: SIGINT, or SIGTERM through checkfree.cli), holding the committed iterations.
            ResumeImpossible: a resumed run has a stage with no live replica and nothing to rebuild it from.
        """
        state = self.state
        try:
            return self._run()
        except SwarmError as exc:
            self.drive(GatheringModel())
            self.results.finish_early(self.run_dir, "failed", str(exc), state.schedule_clock)
            raise
        except KeyboardInterrupt as exc:
            self.drive(GatheringModel())
            self.results.finish_early(self.run_dir, "interrupted", str(exc) or "SIGINT", state.schedule_clock)
            raise
        except ResumeImpossible as exc:  # one sentence, exit 2 (checkfree.cli)
            self.results.finish_early(self.run_dir, "failed", str(exc), state.schedule_clock)
            raise
        except Exception as exc:  # a bug: stop the run, keep the traceback, reap every node (finally below)
            with open(self.run_dir / "supervisor.log", "a") as f:
                f.write(f"internal error of the supervisor:\n{traceback.format_exc()}")
            error = SwarmError(
                f"internal error of the supervisor ({type(exc).__name__}: {exc}); traceback in "
                f"{self.run_dir / 'supervisor.log'}."
            )
            self.results.finish_early(self.run_dir, "failed", str(error), state.schedule_clock)
            raise error from exc
        finally:
            self._journal_end(sys.exc_info()[1])
            self.host.reap_all()
            self.transport.close()

    def _run(self) -> dict[str, Any]:
        """Enter the first phase (resuming, or starting) and drive the loop to its end; the results."""
        state = self.state
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if state.resumed_from is not None:
            self.drive(Resuming())  # re-adopt the live nodes; the run goes on from the journaled state
        else:
            if state.keys is not None:
                for start, path in self.token_paths().items():  # one per other machine: its own secret
                    state.keys.write_token(path, self.address, state.keys.layout.by_start(start))
            self.journal.write("start")
            self.drive(Starting())
        return self.results.finish(self.run_dir, schedule_clock=state.schedule_clock)

    def drive(self, phase: Phase, until: Callable[[Phase], bool] | None = None) -> Any:
        """The supervisor's loop, from ``phase``: each turn receives what came (the phase's ``poll``), notices
        deaths (``watch_deaths``), lets the phase decide (``enter`` on its first turn, then ``step``, and
        ``expired`` once its deadline passed with nothing decided) and carries out the actions it returned; until
        a phase ends the drive (its result is returned) or, with ``until``, the next phase satisfies it (the
        last decision's result is returned: tests drive one phase). A stop signal first drives the phase the
        interrupted one names (a commit in flight is recorded). The state's phase is the one in progress.

        Raises:
            whatever a phase or an action raises (SwarmError at a limit, ResumeImpossible, KeyboardInterrupt).
        """
        state, ctx = self.state, self.context
        outer, state.phase = state.phase, phase
        try:
            decision = phase.enter(ctx, self.clock())
            while True:
                self.carry_out(decision.actions)
                if decision.next is DONE or (
                    decision.next is not phase and until is not None and until(decision.next)
                ):
                    return decision.result
                if decision.next is not phase:
                    phase = state.phase = decision.next
                    decision = phase.enter(ctx, self.clock())
                    continue
                self.serve(phase)
                died = self.processes.check_deaths() if phase.watch_deaths else False
                turn = Turn(self.clock(), died)
                decision = phase.step(ctx, turn)
                if not decision.actions and decision.next is phase and turn.now > phase.ends_at(ctx):
                    decision = phase.expired(ctx, turn)
        except KeyboardInterrupt:
            follow = phase.interrupted(ctx)
            try:
                if follow is not None:
                    self.drive(follow)
            finally:
                phase.abandon(ctx)
            raise
        except BaseException:
            phase.abandon(ctx)
            raise
        finally:
            state.phase = outer

    def clock(self) -> float:
        """The loop's clock (monotonic seconds): the attempts' (tests replace it)."""
        return self.attempts.clock()

    def fetch_weights(self, node: int, stage: int, timeout: float = 30.0, part: str | None = None) -> Message:
        """Ask a serving node for its stage's weights (w.* tensors, meta with grad_norm), or, with ``part``, for
        the CheckFree+ copy of stage 0's "embedding" or "head" it holds; for tests. The loop serves every other
        message meanwhile.

        Raises:
            SwarmError: no answer within ``timeout`` seconds.
        """
        return self.drive(FetchingWeights(node, stage, timeout, part))

    def node_address(self, node: int) -> str | None:
        slot = self.roster.by_node.get(node)
        return slot.address if slot is not None else None

    def write_config(self) -> None:
        (self.run_dir / "swarm_config.json").write_text(jsonio.dumps(self.cfg.to_json(), indent=1))

    # ------------------------------------------------------------------ messages, and what they ask for

    def serve(self, phase: Phase) -> None:
        """Receive every message that arrives within the phase's ``poll`` (and those queued behind it), each offered
        to the phase first, else handled; then, with the phase's ``police`` once training started, evict the nodes
        whose messages were rejected too often and shut out the machines revoked. The only receive of the
        supervisor package (tests/swarm/supervisor/test_one_loop.py counts)."""
        timeout = phase.poll(self.clock())
        if timeout is None:
            return
        with held_signals() if phase.holds_signals(self.context) else contextlib.nullcontext():
            msg = self.link.recv(timeout)
            while msg is not None:
                if not phase.take(msg, self.context):
                    self.handle(msg)
                msg = self.link.recv(0)
        if phase.police and self.state.training:
            for node in self.conduct.verdicts():
                self._evict(node)
            for machine in self.revocations.due():  # swarm revoke (checkfree.swarm.supervisor.machines)
                self.revocations.revoke(machine, self.state.begun_iteration, self.results.now())
                self.journal.write(f"machine {machine.start} revoked")
        if self.transport.identity is not None:
            self.results.refused_connections(self.transport.identity.keyring.refusals.refused)

    def handle(self, msg: Message) -> None:
        """Route one message (checkfree.swarm.supervisor.inbox) and carry out what it asks of the processes; a JOIN
        taken is journaled (a resumed supervisor dials the node at the address it joined from)."""
        joined = msg.type == MessageType.JOIN and self._joined(msg.sender)
        self.execute(self.peer_messages.handle(msg))
        if msg.type == MessageType.JOIN and self._joined(msg.sender) != joined:
            self.journal.write(f"{msg.sender} joined")

    def _joined(self, sender: int) -> str | None:
        """The address node or launcher ``sender`` joined from (None: it has not joined)."""
        slot = self.roster.by_node.get(sender)
        if slot is not None and slot.occupant == sender:
            return slot.address
        return self.roster.launcher_addresses.get(sender)

    def execute(self, actions: list[Action]) -> None:
        """Kill, mark dead or start what the handlers of peer messages named, in order."""
        for action in actions:
            if action.kind == "kill":
                self.processes.kill(action.slot, action.why)
            elif action.kind == "dead":
                self.processes.mark_dead(action.slot, action.why)
            elif action.kind == "start":
                self.processes.spawn(action.slot, replacement=False)
            else:
                raise ValueError(f"unknown action {action.kind!r}")

    def _evict(self, node: int) -> None:
        """Revoke ``node``'s key everywhere and, if it occupies a slot, replace it as if it had crashed
        (checkfree.swarm.supervisor.conduct)."""
        roster, keys = self.roster, self.state.keys
        slot = roster.by_node.get(node)
        cause, own, by = self.conduct.cause(node)
        roster.revoked.add(node)
        if keys is not None:
            keys.revoked.add(node)
        self.link.revoke(node)
        occupies = slot is not None and slot.occupant == node and not slot.dead
        self.results.evicted(node, slot, self.state.begun_iteration, cause, own, by, occupies)
        log.warning("supervisor: node %d evicted: %s", node, cause)
        self.journal.write(f"node {node} evicted")  # its key stays revoked after a resume
        if occupies:
            assert slot is not None
            self.processes.kill(slot, f"evicted: {cause}")  # its peers learn the revocation from 'peers'
        else:
            self.link.broadcast("peers", **roster.peers_fields())

    # ------------------------------------------------------------------ the executor of the phases' actions

    def carry_out(self, actions: list[Act]) -> None:
        """Carry out a phase's actions, in order: each calls its part's operation (checkfree.swarm.supervisor.phases
        .base ``Act``); the part is looked up now (tests replace the link or the processes with fakes)."""
        for action in actions:
            part = self if action.part == "supervisor" else self._parts(action.part)
            getattr(part, action.op)(*action.args, **action.kwargs)

    def _parts(self, name: str) -> Any:
        parts = {
            "link": self.link,
            "processes": self.processes,
            "journal": self.journal,
            "results": self.results,
            "attempts": self.attempts,
            "planner": self.planner,
            "validation": self.validation,
            "model_io": self.model_io,
            "host": self.host,
            "failpoints": failpoints,
        }
        return parts[name]

    def commit_held(self) -> None:
        """Broadcast the attempt's commit with stop signals held: every node gets it, or none."""
        with held_signals():
            self.attempts.commit()

    def committed(
        self, it: int, ends: dict[int, dict[str, Any]] | None, ready: dict[int, dict[str, Any]] | None
    ) -> None:
        """The attempt in progress committed iteration ``it``: record it, and the state's iteration moves on (the
        commit's journal follows between attempts, once the state's iteration moved past it; until then the
        journaled intent stands for it)."""
        current = self.state.current
        assert ends is not None and ready is not None and current is not None
        self.results.iteration(
            it, current.number, ends, ready, current.members
        )  # first: an interrupt finds it
        self._measure(it, current.members)
        self.attempts.committed()
        self.outages.committed()
        self.state.commit_unjournaled = True
        self.results.next_commit_after_resume()
        self.state.iteration = it + 1
        row = self.results.rows[-1]
        log.info("supervisor: iteration %d committed: %.3f s, loss %.4f", it, row["wall_s"], row["loss"])

    def _measure(self, it: int, members: dict[int, list[int]]) -> None:
        """Iteration ``it`` committed: its nodes' ``microbatch_s`` feed the speed estimates, and its row gets the
        routing plan they give and the nodes that turned fail-slow (checkfree.swarm.supervisor.speeds)."""
        self.speeds.observe(self.state.reports.committed)
        where = {slot.occupant: slot.location for slot in self.state.roster.slots}
        try:
            plan = self.speeds.routing_plan(
                members, where, len(members.get(0, [])), self.cfg.mb_count
            ).to_json()
        except ValueError as exc:  # a stage without serving nodes: no plan this iteration
            log.warning("supervisor: no routing plan for iteration %d: %s", it, exc)
            plan = None
        self.results.planned(plan, self.speeds.fail_slow(members, it))

    def forget_intent(self) -> None:
        """The commit recorded after a stop signal is not journaled: the run ends."""
        self.state.intent, self.state.commit_unjournaled = None, False

    def recovered(self, pending: set[int]) -> None:
        """Every slot serves again: ``on_recovered`` with the crashes recovered (``pending``: their nodes)."""
        if self.on_recovered is not None:
            self.on_recovered(self, [c.to_json() for c in self.results.crashes if c.node in pending])

    def dial(self, node: int, address: str) -> bool:
        """Dial a journaled node or launcher again; False if its address cannot be dialled."""
        try:
            self.link.connect(node, address)
        except TransportError as exc:
            log.warning("supervisor: cannot dial %d at %s again: %s", node, address, exc)
            return False
        return True

    def ask(self, node: int, address: str, unasked: dict[int, str]) -> None:
        """Dial a journaled node and ask it ``resume``; one that cannot be dialled is named in ``unasked``."""
        if self.dial(node, address):
            self.link.command(node, "resume")
        else:
            unasked[node] = f"its address {address} cannot be dialled"

    def serving(self, slot: Slot, meta: dict[str, Any]) -> None:
        """Take a ``serving`` a resumed supervisor learned from a node's answer (its recovery finished meanwhile)."""
        self.execute(self.peer_messages.node_commands["serving"](slot, meta))

    # ------------------------------------------------------------------ the journal, and resuming from it

    def _journal_end(self, exc: BaseException | None) -> None:
        """The run ends (``exc``: what ended it, None when it completed): the journal says so, and a later
        ``--resume`` is refused (its nodes are reaped now)."""
        self.state.status = (
            "completed" if exc is None else "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        )
        try:
            self.journal.write(f"the run ended: {self.state.status}")
        except OSError as err:  # the error that ended the run is the one to report
            log.error("supervisor: could not write %s: %s", self.journal.path, err)

    def restore(self, data: dict[str, Any]) -> None:
        """Take the control state, the results so far and the commit intent of a journal (``swarm run --resume``,
        checkfree.swarm.supervisor.journal); :meth:`run` then enters the resuming phase.

        Raises:
            JournalError: the journal does not fit this swarm (another topology, a damaged file).
        """
        now, state = time.monotonic(), self.state
        try:
            state.load(data["state"], now)
            intent = data.get("intent")
            state.intent = CommitIntent.from_json(intent) if intent is not None else None
            for kill, fired in zip(self.recovery_kills.kills, data.get("recovery_kills", []), strict=False):
                kill.fired = bool(fired)
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(
                f"the journal in {self.run_dir} does not fit this swarm ({exc}); expected the journal of its run."
            ) from None
        decode_results(self.results, data["results"])
        for slot in self.roster.all():
            slot.awaited_until(float("inf") if slot.serving else now + self.cfg.recovery_timeout)
        state.resumed_from, state.resumes = data, int(data.get("resumes", 0)) + 1
        keys = state.keys
        if keys is not None:  # every node that may still run, and the launchers, may speak to this supervisor
            ids = ({s.occupant for s in self.roster.all()} | self.roster.launchers) - self.roster.revoked
            self.link.admit({n: keys.public_key(n) for n in ids})
            for node in sorted(self.roster.revoked):
                self.link.revoke(node)
        self.processes.admit_window()
