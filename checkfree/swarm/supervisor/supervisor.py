"""The supervisor: bootstrap, iteration coordinator, crash replayer and result collector (docs/paper.md §8), as
one loop over explicit state.

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

**In-flight microbatches.** A death noticed before ``commit`` aborts the attempt everywhere (``abort``): every
node drops that attempt's activations and accumulated gradients, and stale messages are dropped by their
attempt number. No optimizer has stepped before ``commit``, so nothing is half-applied. The slot gets a
replacement (a new node id, same stage and location) which recovers its weights from the network by the plan the
supervisor made for it (checkfree.swarm.supervisor.planning, the setting's rules in checkfree.swarm.policies);
when every slot serves again, the same iteration is redone from microbatch 0 with the same batches (the data
position is the iteration). So no microbatch is lost or counted twice. A death after ``commit`` was broadcast no
longer aborts: the survivors step, and the replacement copies the stepped state. Under ``checkpoint``, a
whole-stage loss rolls every node back to the newest checkpoint that every stage stored, and the iterations since
are redone.

**One concept, one file.** This module is the loop and every step of it that acts through the supervisor's own
link, processes and journal; what each step decides is computed elsewhere, without them (the attempt's phases,
the loss plans, the resume's verdict in checkfree.swarm.supervisor.adoption, the records). It is long because
the loop has that many steps, not because it holds two concepts.

**One loop over explicit state.** Everything the supervisor decides from is one
:class:`~checkfree.swarm.supervisor.state.SupervisorState` (the slots and their occupants and plans, the
iteration, the attempt in progress, the schedule's clock, the retry counts, the reports received, the checkpoints
stored); :class:`~checkfree.swarm.supervisor.results.Results` only records what happened, for throughput.json.
:meth:`Supervisor.train` is the loop: while the target is not reached, bring every slot back to serving (wait for
a returning node, plan the loss event, replace the dead, roll back), then run one attempt. Every wait is a loop
of this module, and each turn of it receives the nodes' messages in one place (:meth:`Supervisor.serve`). The
parts decide or act at once and never wait, nor call back into the supervisor: the node processes
(checkfree.swarm.supervisor.processes), the messages to nodes (.link), the attempt's phases (.attempts), the
schedule's replay (.outages), the loss-event planning (.planning), the handlers of peer messages (.inbox, which
return what the processes must do), the evidence against misbehaving nodes (.conduct, which names whom to
evict), the soak runs' kills during recoveries (.recovery_kills, ``swarm run --recovery-kills``). They are public:
tests drive them directly.

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
(:meth:`Supervisor.restore`); its :meth:`run` re-adopts the live nodes first (:meth:`_resume`: the verdicts of
checkfree.swarm.supervisor.adoption), finishes or redoes what was in flight, then enters the same loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree import jsonio
from checkfree.failures.traces import DowntimeSchedule
from checkfree.recovery.planner import RecoveryImpossible
from checkfree.swarm.config import SwarmConfig, node_range
from checkfree.swarm.hosts import LocalHost, held_signals
from checkfree.swarm.policies import make_policy
from checkfree.swarm.process_identity import start_time
from checkfree.swarm.supervisor.adoption import CommitIntent, ResumeImpossible, Verdict, judge
from checkfree.swarm.supervisor.attempts import Attempts
from checkfree.swarm.supervisor.conduct import Conduct
from checkfree.swarm.supervisor.failpoints import armed, die_if
from checkfree.swarm.supervisor.inbox import Action, PeerMessages
from checkfree.swarm.supervisor.journal import (
    Journal,
    JournalError,
    decode_results,
    encode_results,
    secret_of,
)
from checkfree.swarm.supervisor.link import POLL_S, Link
from checkfree.swarm.supervisor.machines import Revocations, revoked_before, token_path
from checkfree.swarm.supervisor.model_io import ModelIO, live_members
from checkfree.swarm.supervisor.outages import Outages, check_schedule, schedule_info
from checkfree.swarm.supervisor.planning import LossPlanner
from checkfree.swarm.supervisor.processes import Processes
from checkfree.swarm.supervisor.recovery_kills import RecoveryKill, RecoveryKills
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.state import Attempt, Roster, Slot, SupervisorState, SwarmError
from checkfree.swarm.supervisor.validation import ValidationRuns
from checkfree.swarm.wire import control as schemas
from checkfree.swarm.wire.auth import KeyRing, MachineLayout, SwarmKeys
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.wire.transport import Transport

__all__ = ["Slot", "Supervisor", "SwarmError"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 15.0
RESUME_WAIT_S = 15.0
"""At least this long a resumed supervisor waits for every journaled node's ``resume`` answer (and at least twice
``peer_timeout``: a node's PUSH socket reconnects to the bootstrap address within a second)."""
RECOVERY_POLL_S = 0.02
"""Wait of one receive while the swarm starts, recovers, rolls back, waits or shuts down, seconds."""


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
        ``--resume`` reads them).
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
    ) -> None:
        self.cfg, self.setting, self.iterations = cfg, setting, iterations
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
        self.host = LocalHost(self.run_dir, self.address, bind_host, advertise_host, cache_dir, keys=keys)
        self.results = Results(cfg, setting, iterations)
        self.results.vocab_size = vocab_size
        self.results.schedule = schedule_info(schedule, schedule_path)
        self.link = Link(self.transport, roster)
        self.outages = Outages(schedule, self.state)
        self.options = options or {}
        self.port = int(self.transport.address.rsplit(":", 1)[1])
        self.journal = Journal(self.run_dir, self._journal_content, enabled=journal)
        """``<run_dir>/journal.json``: what a resumed supervisor starts from (checkfree.swarm.supervisor.journal)."""
        self.intent: CommitIntent | None = None
        """The commit decided and journaled before its broadcast (None once the commit itself is journaled)."""
        self._commit_unjournaled = False
        self.resumed_from: dict[str, Any] | None = None
        """The journal this supervisor resumes (:meth:`restore`), None for a new run."""
        self.resumes = 0
        self.stale_after_resume = 0
        """Messages for the dead supervisor that a resumed one dropped (checkfree.swarm.supervisor.adoption)."""
        self.processes = Processes(
            self.state, self.link, self.host, self.results, self.address, journal=self.journal
        )
        self.attempts = Attempts(self.state, self.link)
        self.planner = LossPlanner(self.policy, self.state, self.link)
        self.peer_messages = PeerMessages(self.state, self.link, self.results, self.conduct)
        self.recovery_kills = RecoveryKills(recovery_kills or [], roster)
        records, now = self.results.model, self.results.now  # validations, the model, snapshots
        self.validation = ValidationRuns(self.state, self.link, records, now)
        self.model_io = ModelIO(cfg, setting, vocab_size, self.link, self.run_dir, records, now, cache_dir)
        self.peer_messages.node_handlers[MessageType.WEIGHTS_RESPONSE] = self.model_io.on_weights
        self.peer_messages.node_commands["evaluated"] = self.validation.on_evaluated
        self.revocations = Revocations(
            self.state, self.link, self.processes, self.results.machine_revocations, self.run_dir
        )
        """Machines shut out while the run goes on (``swarm revoke``; checkfree.swarm.supervisor.machines)."""

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
        """Start, train, shut down; returns (and writes) the throughput results.

        Raises:
            SwarmError: a retry limit was exceeded, or an internal error (a bug) stopped the run: its
                traceback is appended to ``<run_dir>/supervisor.log``. Every node is reaped either way, and
                throughput.json is written with ``"status": "failed"`` and the cause (``"interrupted"`` on a
                KeyboardInterrupt: SIGINT, or SIGTERM through checkfree.cli), holding the committed iterations.
        """
        state = self.state
        try:
            return self._run()
        except SwarmError as exc:
            self._keep_model()
            self.results.finish_early(self.run_dir, "failed", str(exc), state.schedule_clock)
            raise
        except KeyboardInterrupt as exc:
            self._keep_model()
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
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resumed_from is not None:
            self._resume()  # re-adopt the live nodes; the run goes on from the journaled state
        else:
            if self.state.keys is not None:
                for start, path in self.token_paths().items():  # one per other machine: its own secret
                    self.state.keys.write_token(path, self.address, self.state.keys.layout.by_start(start))
            self.journal.write("start")
            self._start_nodes()
        if not self.state.training:
            if self.roster.storage is not None and not self.state.checkpoints.holds_initial():
                self._store_initial()
            self.results.start()
            self.state.training = True
        self.train()
        self._keep_model()
        self._shutdown()
        return self.results.finish(self.run_dir, schedule_clock=self.state.schedule_clock)

    def train(self) -> None:
        """The loop: until ``iterations`` are committed (or a replayed trace's window is over), bring every slot
        back to serving, then run one attempt at the state's iteration; a commit moves it on, an abort redoes
        it, a rollback moves it back. It starts from the state, whatever the state holds."""
        state = self.state
        if self.validation.due(state.iteration, self.iterations):  # iteration 0, as the simulator
            self._validate()
        while state.iteration < self.iterations:
            state.iteration = self._ensure_serving(state.iteration)
            if self.outages.over():  # a replayed trace's window is over
                self.results.ended_by = "schedule"
                log.warning(
                    "supervisor: the schedule's %d iterations are over after %d committed iterations; the run ends",
                    state.schedule_clock,
                    state.iteration,
                )
                break
            if self._attempt(state.iteration):
                state.iteration += 1
                self._after_commit()
        if self.validation.due_at_end():  # the run ended before its target (a replayed trace's window)
            self._validate()

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
            msg = self.link.recv(0.05)
            if msg is None:
                continue
            if msg.type == MessageType.WEIGHTS_RESPONSE and msg.meta.get("request") == rid:
                return msg
            self.handle(msg)
        raise SwarmError(f"node {node} did not answer a weights request within {timeout:.0f} s.")

    def node_address(self, node: int) -> str | None:
        slot = self.roster.by_node.get(node)
        return slot.address if slot is not None else None

    def write_config(self) -> None:
        (self.run_dir / "swarm_config.json").write_text(jsonio.dumps(self.cfg.to_json(), indent=1))

    # ------------------------------------------------------------------ messages, and what they ask for

    def serve(self, timeout: float, police: bool = True) -> None:
        """Handle every message that arrives within ``timeout`` seconds (and those queued behind it); then, with
        ``police`` once training started, evict the nodes whose messages were rejected too often."""
        msg = self.link.recv(timeout)
        while msg is not None:
            self.handle(msg)
            msg = self.link.recv(0)
        if police and self.state.training:
            for node in self.conduct.verdicts():
                self._evict(node)
            for machine in self.revocations.due():  # swarm revoke (checkfree.swarm.supervisor.machines)
                self.revocations.revoke(machine, self.state.begun_iteration, self.results.now())
                self.journal.write(f"machine {machine.start} revoked")
        if self.transport.identity is not None:
            self.results.supervisor_refused_connections = self.transport.identity.keyring.refusals.refused

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
        self.results.evictions.append(
            {
                "node": node,
                "slot": slot.slot if slot is not None else None,
                "stage": slot.stage if slot is not None else None,
                "iteration": self.state.begun_iteration,
                "t": self.results.now(),
                "cause": cause,
                "rejected_by_supervisor": own,
                "reported_by": {str(r): n for r, n in sorted(by.items())},
                "replaced": occupies,
            }
        )
        log.warning("supervisor: node %d evicted: %s", node, cause)
        self.journal.write(f"node {node} evicted")  # its key stays revoked after a resume
        if occupies:
            assert slot is not None
            self.processes.kill(slot, f"evicted: {cause}")  # its peers learn the revocation from 'peers'
        else:
            self.link.broadcast("peers", **roster.peers_fields())

    # ------------------------------------------------------------------ starting

    def _start_nodes(self, spawn: bool = True) -> None:
        """Start this machine's initial nodes (``spawn``; a resumed supervisor only restarts the dead ones) and wait
        until every slot serves (a node that fails to start is started again under its id, at most
        ``max_attempts`` times)."""
        for slot in self.roster.all():
            if slot.local and spawn:
                self.processes.spawn(slot, replacement=False)
        while True:
            self.serve(RECOVERY_POLL_S)
            self.processes.check_deaths()
            self.processes.replace_dead(initial=True)
            if self.roster.all_serving():
                return

    def _store_initial(self) -> None:
        """Have every stage store version 0 before training starts (``checkpoint``).

        Raises:
            SwarmError: the storage node did not store it within ``recovery_timeout``.
        """
        self.link.broadcast("checkpoint", checkpoint_senders=checkpoint_senders(self.roster))
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not self.state.checkpoints.holds_initial():
            if time.monotonic() > deadline:
                raise SwarmError("the storage node did not store the initial checkpoint in time.")
            self.serve(RECOVERY_POLL_S)

    # ------------------------------------------------------------------ one attempt

    def _attempt(self, it: int) -> bool:
        """One attempt at iteration ``it``; True when committed, False when aborted (redo).

        Raises:
            SwarmError: iteration ``it`` failed ``max_attempts`` attempts.
        """
        due = [slot.slot for slot in self.outages.due(it)]
        current = self.attempts.begin(it, due, self.results.last_wall_s())
        die_if("begun", it, after_s=0.3)  # the resume tests' fault injection (unset in real runs)
        try:
            while True:
                # in the commit phase a stop signal waits for the message in hand: a `committed` report
                # received but not yet taken would leave the commit unrecorded and the model a step ahead
                with held_signals() if current.phase == "commit" else contextlib.nullcontext():
                    self.serve(POLL_S)
                now = self.attempts.clock()
                if self.attempts.crash_due(now):
                    self._fire(it)
                if self.processes.check_deaths() and current.phase != "commit":
                    self.attempts.abort("a node died")
                    self.results.aborted(it)
                    return False
                step = self.attempts.advance(now)
                if step is None:
                    continue
                if step.kind == "fire":
                    self._fire(it)
                    continue
                if step.kind == "commit":  # journaled before any node can step
                    assert step.ends is not None and step.ready is not None
                    self.intent = CommitIntent(current.number, it, current.members, step.ends, step.ready)
                    self.journal.write(f"commit of iteration {it}")
                    if armed(
                        "commit-partial", it
                    ):  # the resume tests: one node steps, then the supervisor dies
                        self.attempts.commit(to=current.nodes()[:1])
                        die_if("commit-partial", it, after_s=1.0)
                    with held_signals():  # every node gets the commit, or none (a stop signal waits for it)
                        self.attempts.commit()
                    continue
                if step.kind == "committed":
                    self._committed(it, current, step.ends, step.ready)
                    return True
                self.attempts.retry(step.why)  # raises SwarmError at the limit
                self.results.aborted(it)
                return False
        except KeyboardInterrupt:
            if current.phase == "commit":  # the commit went out: the nodes step whatever the supervisor does
                self._record_commit_in_flight(it, current)
            raise
        finally:
            current.phase = "over"  # later reports of this attempt are stale

    def _record_commit_in_flight(self, it: int, current: Attempt) -> None:
        """Ctrl-C or SIGTERM landed after the commit of iteration ``it`` went out: the nodes step anyway, so wait
        (at most ``request_timeout``) for their ``committed`` reports and record the iteration, and the model kept
        at the end and throughput.json's committed iterations are the same. A node that does not report in time
        leaves it unrecorded (the model's gather then says the stages hold different iterations)."""
        if self.results.rows and self.results.rows[-1]["iteration"] == it:  # recorded already
            return
        deadline = time.monotonic() + self.cfg.request_timeout
        while time.monotonic() < deadline:
            self.serve(POLL_S)
            step = self.attempts.advance(self.attempts.clock())
            if step is not None and step.kind == "committed":
                self._committed(it, current, step.ends, step.ready)
                self.state.iteration, self.intent, self._commit_unjournaled = it + 1, None, False
                return
        log.warning(
            "supervisor: the commit of iteration %d was not confirmed by every node; not recorded", it
        )

    def _committed(
        self,
        it: int,
        current: Attempt,
        ends: dict[int, dict[str, Any]] | None,
        ready: dict[int, dict[str, Any]] | None,
    ) -> None:
        """Attempt ``current`` committed iteration ``it``: record it (its journal follows at the loop's next turn,
        :meth:`_flush_journal`, once the state's iteration has moved on; until then the journaled intent stands
        for it)."""
        assert ends is not None and ready is not None
        self.results.iteration(  # first: an interrupt from here on finds the iteration recorded
            it,
            current.number,
            ends,
            ready,
            current.members,
        )
        self.attempts.committed()
        self.outages.committed()
        self._commit_unjournaled = True
        outages = self.results.outages
        if outages and outages[-1]["t_next_commit"] is None:
            outages[-1]["t_next_commit"] = self.results.now()
        row = self.results.rows[-1]
        log.info("supervisor: iteration %d committed: %.3f s, loss %.4f", it, row["wall_s"], row["loss"])

    def _flush_journal(self) -> None:
        """Journal the last commit if it is not yet (the state's iteration has moved on past it)."""
        if self._commit_unjournaled:
            self.intent, self._commit_unjournaled = None, False
            self.journal.write(f"committed iteration {self.state.iteration - 1}")
            die_if("committed", self.state.iteration - 1)  # the resume tests' fault injection

    def _fire(self, it: int) -> None:
        """The scheduled crashes of the attempt in progress fire now (journaled as fired first: a resumed
        supervisor never fires one twice)."""
        current = self.state.current
        assert current is not None
        fired = [(self.roster.slots[n], self.outages.fire(self.roster.slots[n], it)) for n in current.due]
        if fired:
            self.journal.write(f"scheduled crashes at iteration {it}")
        for slot, down in fired:
            self._crash(slot, it, down)

    def _crash(self, slot: Slot, it: int, down: int) -> None:
        """The scheduled crash of ``slot`` at schedule iteration ``down`` (during training iteration ``it``): kill
        its node and keep the slot away as long as the schedule says; ``no_failure`` logs it and kills nobody."""
        if not self.policy.loses_state:
            self.results.skipped.append({"slot": slot.slot, "stage": slot.stage, "iteration": it})
            log.info(
                "supervisor: scheduled crash of slot %d at iteration %d skipped (no_failure)", slot.slot, it
            )
            return
        if (
            not slot.dead
        ):  # else its node is gone already (it came back and was not replaced yet): it stays away
            self.results.scheduled_kill(slot, it)
            self.processes.kill(slot, f"scheduled crash at iteration {it}")
        if self.outages.keep_away(slot, down):
            self.results.kept_away(slot)

    # ------------------------------------------------------------------ recovering

    def _ensure_serving(self, it: int) -> int:
        """Bring back the slots whose down interval ended, wait while a stage has no replica left to come back,
        then recover every dead slot before the next attempt; returns the iteration to run (rollback!)."""
        self._flush_journal()
        self.outages.bring_back()
        self._wait_for_returns(it)
        if self.roster.all_serving() or self.outages.over():
            return it
        lost = self.roster.lost_stages()
        self.results.stages_lost(lost)
        self.planner.plan_event(lost)
        rollback = bool(lost) and self.policy.rollback_on_stage_loss
        self._check_rollback(rollback, lost)
        pending = {c.node for c in map(self.results.open_crash, self.roster.slots) if c is not None}
        while True:  # until every slot serves again (but those the schedule keeps away)
            self.serve(RECOVERY_POLL_S)
            self._check_rollback(rollback, lost)  # the storage node died: its checkpoints went with it
            self.planner.answer_replans()
            for victim, why in self.recovery_kills.tick(self.state.begun_iteration):
                self.processes.kill(victim, why)
            if self.processes.check_deaths():  # a new loss event: planned before any replacement of it starts
                new_loss = self.roster.lost_stages()
                self.planner.plan_event(new_loss)
                if new_loss and self.policy.rollback_on_stage_loss and not rollback:
                    rollback, lost = True, new_loss  # a stage lost while a partial loss recovers
                    self._check_rollback(rollback, lost)
            self.processes.replace_dead()
            if any(s.address is not None and not s.serving and not s.dead for s in self.roster.slots):
                die_if("recovering", it, after_s=0.2)  # the resume tests: a replacement is mid-recovery
            if self.roster.all_serving():
                break
        if rollback:
            version = self.state.checkpoints.newest_complete()
            self.results.rollback_bytes += self._rollback(version)
            self.results.rollbacks.append(
                {
                    "at_iteration": it,
                    "to_iteration": version,
                    "lost_stages": sorted(lost),
                    "t": self.results.now(),
                }
            )
            it = self.state.iteration = version
            self.journal.write(f"rolled back to iteration {version}")
        for slot in self.roster.all():  # the storage node's too: its restarts are not one failing start
            slot.tries = 0
        if self.on_recovered is not None:
            self.on_recovered(self, [c.to_json() for c in self.results.crashes if c.node in pending])
        return it

    def _check_rollback(self, rollback: bool, lost: set[int]) -> None:
        """Raise SwarmError once a rollback is needed and no checkpoint every stage stored is left."""
        if rollback and not self.state.checkpoints.has_complete():
            cause = self.state.checkpoints.missing_cause()
            raise SwarmError(f"stages {sorted(lost)} were lost and cannot be rolled back: {cause}.")

    def _rollback(self, version: int) -> int:
        """Roll every serving node not at ``version`` back to it (a slot the schedule keeps away copies a live
        replica when it comes back) and wait until each restored it; returns the bytes the nodes restored.

        Raises:
            SwarmError: a node died, the storage node died (its checkpoints with it), or the rollback timed out.
        """
        targets = {s.occupant for s in self.roster.slots if s.serving and s.version != version}
        log.warning(
            "supervisor: a whole stage was lost; rolling %d nodes back to iteration %d", len(targets), version
        )
        self.state.inbox.pop("restored", None)
        for node in targets:
            self.link.command(node, "rollback", version=version)
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not targets <= set(self.state.reported("restored")):
            self.serve(RECOVERY_POLL_S, police=False)  # no eviction mid-rollback: a death here fails the run
            storage = self.roster.storage
            storage_died = storage is not None and storage.dead
            if self.processes.check_deaths() or storage_died or time.monotonic() > deadline:
                raise SwarmError(
                    f"rollback to iteration {version} did not finish (a node or the storage node died, or it "
                    "timed out)."
                )
        return sum(m.get("bytes", 0) for m in self.state.reported("restored").values())

    def _idle(self, seconds: float) -> None:
        """Serve messages and notice deaths for ``seconds`` (while the swarm waits for a returning node)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.serve(min(RECOVERY_POLL_S, max(0.0, deadline - time.monotonic())))
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
            self.state.schedule_clock,
            reference,
        )
        waited, seconds, start = self._wait_out(it, reference)
        self.results.waited(it, waited, reference, seconds, start, self.state.schedule_clock)
        log.warning(
            "supervisor: waited %.1f s (schedule iterations %d → %d) for stages %s",
            seconds,
            start,
            self.state.schedule_clock,
            sorted(waited),
        )

    def _wait_out(self, it: int, reference_s: float) -> tuple[dict[int, int], float, int]:
        """Wait while a stage is lost with every replica away: one schedule iteration per ``reference_s`` seconds,
        firing the crashes and returns due meanwhile, until every lost stage has a slot coming back, or until the
        schedule is over (no node of the stage comes back within it).

        Returns:
            (stage → schedule iterations it waited, seconds waited, the schedule clock when the wait began).
        """
        waited: dict[int, int] = {}
        start_clock, t0 = self.state.schedule_clock, time.monotonic()
        stranded = self.outages.stranded()
        while stranded and not self.outages.over():
            for stage in stranded:
                waited[stage] = waited.get(stage, 0) + 1
            self._idle(reference_s)
            crashes = self.outages.advance()  # down intervals go by the clock, not a training iteration
            if crashes:
                self.journal.write(f"scheduled crashes at schedule iteration {self.state.schedule_clock}")
            for slot, down in crashes:
                self._crash(slot, it, down)
            self.outages.bring_back()
            stranded = self.outages.stranded()
        return waited, time.monotonic() - t0, start_clock

    # ------------------------------------------------------------------ the model: validation, snapshots, gather

    def _after_commit(self) -> None:
        """A validation when one is due, then the snapshots' turn (checkfree.swarm.supervisor.validation, .model_io)."""
        if self.validation.due(self.state.iteration, self.iterations):
            self._validate()
        self.model_io.after_commit(self.state.iteration, self.roster.members())

    def _validate(self) -> None:
        """Run the validation batches through the pipeline, forward only, and record the validation loss; a node's
        death or ``iteration_timeout`` gives the evaluation up (the loop's next turn recovers the node)."""
        if not self.validation.begin():
            return
        deadline = time.monotonic() + self.cfg.iteration_timeout
        while not self.validation.complete():
            self.serve(POLL_S)
            if self.processes.check_deaths():
                self.validation.give_up("a node died")
                return
            if time.monotonic() > deadline:
                self.validation.give_up(
                    f"not every stage-0 node reported within {self.cfg.iteration_timeout:.0f} s"
                )
                return
        self.validation.finish()

    def _keep_model(self) -> None:
        """However the run ends: one serving replica per stage sends its weights, written to ``<run_dir>/model/``
        (checkfree.swarm.supervisor.model_io; a stage without one is said in one sentence), and the snapshot in
        flight completes. The run is ending: only the answers are acted on."""
        self.model_io.gather(live_members(self.roster, self.link.silent(), self.host.exited))
        deadline = time.monotonic() + self.cfg.request_timeout
        while not self.model_io.settled() and time.monotonic() < deadline:
            msg = self.link.recv(RECOVERY_POLL_S)
            if msg is not None and msg.type == MessageType.WEIGHTS_RESPONSE:  # to the gather or a snapshot
                self.peer_messages.handle(msg)  # (model_io); nothing for the processes
        self.model_io.finish_snapshots(self.cfg.request_timeout)
        self.model_io.write_model()

    # ------------------------------------------------------------------ the journal, and resuming from it

    def _journal_content(self, why: str) -> dict[str, Any]:
        """What journal.json holds now (checkfree.swarm.supervisor.journal)."""
        keys, journal = self.state.keys, self.journal
        self.results.journal = {"writes": journal.writes, "seconds": journal.seconds, "bytes": journal.nbytes}
        processes = {}
        for node in list(self.host.procs):
            ident = self.host.identity(node)
            if ident is not None:
                processes[str(node)] = list(ident)
        return {
            "status": getattr(self, "_status", "running"),
            "options": self.options,
            "supervisor": {"pid": os.getpid(), "started": start_time(os.getpid())},
            "address": self.address,
            "port": self.port,
            "swarm_secret": secret_of(keys),
            "revoked_keys": sorted(keys.revoked) if keys is not None else [],
            "state": self.state.to_json(),
            "intent": self.intent.to_json() if self.intent is not None else None,
            "results": encode_results(self.results),
            "processes": processes,
            "recovery_kills": [kill.fired for kill in self.recovery_kills.kills],
            "resumes": self.resumes,
        }

    def _journal_end(self, exc: BaseException | None) -> None:
        """The run ends (``exc``: what ended it, None when it completed): the journal says so, and a later
        ``--resume`` is refused (its nodes are reaped now)."""
        self._status = (
            "completed" if exc is None else "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        )
        try:
            self.journal.write(f"the run ended: {self._status}")
        except OSError as err:  # the error that ended the run is the one to report
            log.error("supervisor: could not write %s: %s", self.journal.path, err)

    def restore(self, data: dict[str, Any]) -> None:
        """Take the control state, the results so far and the commit intent of a journal (``swarm run --resume``,
        checkfree.swarm.supervisor.journal); :meth:`run` then re-adopts the live nodes and goes on.

        Raises:
            JournalError: the journal does not fit this swarm (another topology, a damaged file).
        """
        now = time.monotonic()
        try:
            self.state.load(data["state"], now)
            intent = data.get("intent")
            self.intent = CommitIntent.from_json(intent) if intent is not None else None
            for kill, fired in zip(self.recovery_kills.kills, data.get("recovery_kills", []), strict=False):
                kill.fired = bool(fired)
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(
                f"the journal in {self.run_dir} does not fit this swarm ({exc}); expected the journal of its run."
            ) from None
        decode_results(self.results, data["results"])
        for slot in self.roster.all():
            slot.deadline = float("inf") if slot.serving else now + self.cfg.recovery_timeout
        self.resumed_from, self.resumes = data, int(data.get("resumes", 0)) + 1
        keys = self.state.keys
        if keys is not None:  # every node that may still run, and the launchers, may speak to this supervisor
            ids = ({s.occupant for s in self.roster.all()} | self.roster.launchers) - self.roster.revoked
            self.link.admit({n: keys.public_key(n) for n in ids})
            for node in sorted(self.roster.revoked):
                self.link.revoke(node)
        self.processes.admit_window()

    def _resume(self) -> None:
        """Re-adopt the live nodes after the supervisor died (checkfree.swarm.supervisor.adoption): take over the
        journaled processes that still run (pid and start time), dial every journaled node and launcher, ask each
        node where it is (``resume``), replace the nodes whose answer does not fit the journal (or that gave none),
        finish the commit the dead supervisor had begun or abort the attempt it left in flight, and record the
        outage; then the run goes on from the journaled state (its loop replaces the dead).

        Raises:
            ResumeImpossible: a stage has no live replica and nothing it can be rebuilt from.
        """
        data, state, roster = self.resumed_from, self.state, self.roster
        assert data is not None
        t_resumed = self.results.now()
        log.warning(
            "supervisor: resuming the run in %s (resume %d) at iteration %d from its journal of %s",
            self.run_dir,
            self.resumes,
            state.iteration,
            time.strftime("%H:%M:%S", time.localtime(data["written"])),
        )
        for node, (pid, started) in data["processes"].items():
            self.host.adopt(int(node), pid, started)
        for launcher, address in sorted(roster.launcher_addresses.items()):
            self._dial(launcher, address)
        asked, unasked = [], {}
        for slot in roster.all():
            node = slot.occupant
            if slot.dead:
                continue
            if slot.local and (node not in self.host.procs or self.host.exited(node) is not None):
                unasked[node] = "its process is gone"
            elif slot.address is None:
                unasked[node] = "it had not joined (as the journal knows) when the supervisor died"
            elif not self._dial(node, slot.address):
                unasked[node] = f"its address {slot.address} cannot be dialled"
            else:
                self.link.command(node, "resume")
                asked.append(node)
        # the forkserver ready (swarm run --resume began its imports) before training goes on, as in a fresh run
        self.host.warm_up(wait=True)
        wait = max(RESUME_WAIT_S, 2 * self.cfg.peer_timeout)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and not set(asked) <= set(state.reported("resumed")):
            self._serve_answers(RECOVERY_POLL_S)
            if all(self.host.exited(n) is not None for n in set(asked) - set(state.reported("resumed"))):
                break  # the ones left have exited (here: their grace ran out)
        claims = dict(state.reported("resumed"))
        intent = self.intent if self.intent is not None and self.intent.iteration == state.iteration else None
        verdict = judge(state, intent, claims, wait, unasked)
        self._apply(verdict, claims)
        self._check_resumable()
        redone = [state.iteration] if verdict.in_flight and not verdict.roll_forward else []
        rolled = state.iteration if verdict.roll_forward else None
        if verdict.roll_forward:
            assert intent is not None
            self._finish_commit(intent, verdict, claims)
        else:
            for node, claim in verdict.adopt.items():
                if claim["attempt"] >= 0:
                    self.link.command(node, "abort", attempt=claim["attempt"])
            if verdict.in_flight:
                self.results.aborted(state.iteration)
        if not verdict.roll_forward:
            # the attempt begun last: the one in flight (aborted), else the last commit
            begun = state.iteration if verdict.in_flight else max(state.iteration - 1, 0)
            state.current = Attempt(state.attempt, begun, roster.members(), time.monotonic(), phase="over")
        self.link.broadcast("peers", **roster.peers_fields())
        lost = [c.get("last_control_wall", 0.0) for c in claims.values()] + [float(data["written"])]
        started = self.results.started_at
        self.results.outages.append(
            {
                "resume": self.resumes,
                "t_lost": max(lost) - started if started is not None else None,
                "t_resumed": t_resumed,
                "t_adopted": self.results.now(),
                "t_next_commit": self.results.now() if rolled is not None else None,
                "from_iteration": state.iteration - (rolled is not None),
                "iterations_redone": redone,
                "rolled_forward": rolled,
                "adopted": sorted(verdict.adopt),
                "replaced": {str(n): why for n, why in sorted(verdict.replace.items())},
                "stale_messages_dropped": self.stale_after_resume,
            }
        )
        log.warning(
            "supervisor: resumed: %d nodes adopted, %d replaced%s%s",
            len(verdict.adopt),
            len(verdict.replace),
            f", the commit of iteration {rolled} finished" if rolled is not None else "",
            f", iteration {redone[0]} is redone" if redone else "",
        )
        self.journal.write(f"resume {self.resumes}")
        if rolled is not None and hasattr(self, "_after_commit"):
            self._after_commit()
        if not state.training:
            self._start_nodes(spawn=False)

    def _serve_answers(self, timeout: float) -> None:
        """Take the nodes' ``resumed`` answers (and the launchers' reports); drop, uncounted, what their send queues
        still held for the dead supervisor (reports of its attempts, a replacement's JOIN or ``serving``): a node's
        queue to the bootstrap address is flushed, in order, before its answer arrives."""
        msg = self.link.recv(timeout)
        while msg is not None:
            if msg.sender in self.roster.launchers or (
                msg.type == MessageType.CONTROL and msg.meta.get("command") == "resumed"
            ):
                self.handle(msg)
            else:
                self.stale_after_resume += 1
            msg = self.link.recv(0)

    def _dial(self, node: int, address: str) -> bool:
        """Dial a journaled node or launcher again; False if its address cannot be dialled."""
        try:
            self.link.connect(node, address)
        except TransportError as exc:
            log.warning("supervisor: cannot dial %d at %s again: %s", node, address, exc)
            return False
        return True

    def _apply(self, verdict: Verdict, claims: dict[int, dict[str, Any]]) -> None:
        """Carry out a resume's verdict: kill (by pid, or through the launcher) and mark dead the nodes it
        replaces, take the adopted nodes' versions and stage-0 copies, their ``serving`` for a recovery that
        finished while the supervisor was away, and the storage node's versions."""
        state, roster = self.state, self.roster
        state.attempt = verdict.attempt
        for slot in roster.all():  # local processes that are gone, and the starts the journal only reserved
            if not slot.dead and slot.occupant not in claims and slot.occupant not in verdict.replace:
                verdict.replace[slot.occupant] = "its process is gone"
        for node, why in sorted(verdict.replace.items()):  # the peers learn the new table once, at the end
            self.processes.kill(roster.by_node[node], f"resume: {why}", tell_peers=False)
        for node, claim in verdict.adopt.items():
            slot = roster.by_node[node]
            if slot is roster.storage:
                stored = claim.get("stored_versions", {})
                state.checkpoints.stored = {int(k): set(v) for k, v in stored.items()}
                continue
            slot.version = claim["version"]
            if "stage0_copy" in claim and slot.stage in (1, self.cfg.n_stages):
                slot.copy_version = claim["stage0_copy"]
        for node in verdict.recovered:
            claim, slot = claims[node], roster.by_node[node]
            if "record" not in claim:
                self.processes.kill(slot, "resume: it serves, but sent no recovery record")
                continue
            meta = {
                "command": "serving",
                "stage": slot.stage,
                "version": claim["version"],
                "record": claim["record"],
            }
            self.execute(self.peer_messages.node_commands["serving"](slot, meta))

    def _check_resumable(self) -> None:
        """Raise ResumeImpossible naming the first lost stage the setting cannot rebuild from what is alive (no
        stage is waited for by a down-interval schedule)."""
        roster, state = self.roster, self.state
        if not any(s.serving for s in roster.slots):
            raise ResumeImpossible(
                f"no node of the swarm in {self.run_dir} is alive: every stage has no live replica and no snapshot "
                f"to restore it from{self._snapshot_note()}; the run cannot be resumed."
            )
        lost = roster.lost_stages() - set(self.outages.stranded())
        for stage in sorted(lost):
            why = None
            try:
                plan = self.policy.plan(stage, lost, self.cfg.n_stages, holding=roster.holding_stages())
            except RecoveryImpossible as exc:
                why = str(exc).rstrip(".")
            else:
                if plan.rule == "storage":
                    storage = roster.storage
                    if storage is None or storage.dead or not state.checkpoints.has_complete():
                        why = state.checkpoints.missing_cause()
                elif not plan.sources:
                    why = f"{self.setting} would rebuild it from a random init, with no live stage to rebuild it from"
            if why is not None:
                raise ResumeImpossible(
                    f"stage {stage} has no live replica and no snapshot to restore it from{self._snapshot_note()} "
                    f"({why}); the run in {self.run_dir} cannot be resumed."
                )

    def _snapshot_note(self) -> str:
        """Names the newest snapshot a lost stage could be restored from, which --resume does not use yet."""
        records = getattr(self.results, "model", None)
        newest = getattr(records, "newest_snapshot", None) if records is not None else None
        if newest is None:
            return ""
        return (
            f" (the snapshot {newest['path']} of iteration {newest['iteration']} is not restored by --resume)"
        )

    def _finish_commit(
        self, intent: CommitIntent, verdict: Verdict, claims: dict[int, dict[str, Any]]
    ) -> None:
        """Finish the commit of ``intent`` that the dead supervisor began (checkfree.swarm.supervisor.adoption):
        ``commit`` again to the members that still hold its gradients (each steps once), the ones that stepped
        count as committed; record the iteration from the journaled intent."""
        state = self.state
        now = time.monotonic()
        current = Attempt(
            intent.attempt, intent.iteration, intent.members, now, deadline=now + self.cfg.iteration_timeout
        )
        state.current, state.inbox = current, {"iteration_end": intent.ends, "ready": intent.ready}
        state.inbox["committed"] = {n: {**claims[n], "attempt": intent.attempt} for n in verdict.stepped}
        current.reported["committed"] = set(verdict.stepped)
        self.attempts.commit(to=verdict.pending)
        log.warning(
            "supervisor: finishing the commit of iteration %d (attempt %d): %d nodes stepped, %d step now",
            intent.iteration,
            intent.attempt,
            len(verdict.stepped),
            len(verdict.pending),
        )
        while True:
            self.serve(POLL_S, police=False)
            self.processes.check_deaths()
            step = self.attempts.advance(self.attempts.clock())
            if step is None:
                continue
            if step.kind == "committed":
                break
            late = set(current.nodes()) - set(state.reported("committed"))  # past iteration_timeout
            for node in sorted(late):
                slot = self.roster.by_node[node]
                if slot.occupant == node and not slot.dead:
                    self.processes.kill(slot, f"resume: did not step the commit of attempt {intent.attempt}")
            current.deadline = float("inf")
        rows = self.results.rows
        if rows and (rows[-1]["iteration"], rows[-1]["attempt"]) == (intent.iteration, intent.attempt):
            self.attempts.committed()  # recorded already: the journal was written after the commit's record
            self.state.iteration = intent.iteration + 1
            self._commit_unjournaled = True
            return
        self._committed(intent.iteration, current, intent.ends, intent.ready)
        self.state.iteration = intent.iteration + 1

    # ------------------------------------------------------------------ shutting down

    def _shutdown(self) -> None:
        self.results.still_away = [s.slot for s in self.roster.slots if s.away]
        self.state.inbox.clear()
        self.link.broadcast("shutdown")
        expected = {s.occupant for s in self.roster.all() if not s.dead}
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while not expected <= set(self.state.reported("final")) and time.monotonic() < deadline:
            self.serve(RECOVERY_POLL_S)
        missing = expected - set(self.state.reported("final"))
        if missing:
            log.warning("supervisor: no final stats from nodes %s", sorted(missing))
        self.results.finals = self.state.reported("final")
        for launcher in self.roster.launchers:
            self.link.command(launcher, "shutdown")
        self.host.wait_all(timeout=10.0)


def checkpoint_senders(roster: Roster) -> list[int]:
    """One serving replica per stage: the nodes that send their stage to the storage node (``checkpoint``)."""
    return [ids[0] for ids in roster.members().values() if ids]
