"""The supervisor's side of every peer message: dispatch tables and the checks only the supervisor can make.

A message reaching these handlers has passed the wire format, the sender binding (CURVE) and its schema
(checkfree.swarm.wire.control). :meth:`PeerMessages.handle` routes it: JOIN first (a node or a launcher introduces
itself), then launchers' reports, then, for the current occupant of a slot, the handler of its message type
(``node_handlers``) and CONTROL command (``node_commands``). A handler that finds a message implausible (a
version ahead of the iterations begun, a JOIN for a slot that joined already, an address libzmq refuses, a
``stored`` from a node that is not the storage node) raises ``ProtocolError``; ``handle`` logs it, counts it
in ``bad_messages`` and as an offence of its sender (checkfree.swarm.supervisor.conduct, which evicts a node
whose messages keep being rejected), and never lets it out: one message cannot stop the supervisor.

**A node's report is a claim, checked against what the supervisor knows of the attempt in progress**
(checkfree.swarm.supervisor.state ``Attempt``), never a verdict. A report of an attempt that has not begun is
rejected; one of an attempt that is over (aborted, committed) is stale and ignored; each node reports each of
``iteration_end`` / ``stalled`` / ``ready`` / ``committed`` at most once per attempt, and only as a member of it:

* ``ITERATION_END`` only from a stage-0 member, during the forward phase, with the tokens of a whole pipeline;
  after a ``reroute`` that moved its pipeline, one sent before that re-route (``reroutes`` lower) is stale and
  ignored, and one more is taken (checkfree.swarm.supervisor.attempts ``Attempts.reroute``);
* ``stalled`` (which aborts and redoes the attempt) only from a stage-0 member whose pipeline has not ended,
  and not before ``microbatch_timeout`` seconds since ``begin`` (by the supervisor's clock): a node reports a
  stall only after a microbatch has been out that long, and its ``begin`` came after the supervisor's. In a
  healthy swarm every attempt ends sooner, so no member can abort attempts at will;
* ``ready`` only after ``sync``, with a finite gradient norm ≥ 0 (the schema), a plausible number of
  pipelines, and naming as dropped only other replicas of its stage in this attempt (each is evidence against
  that replica, not a verdict);
* ``committed`` only after ``commit``, with the version that commit gives (the iteration + 1);
* ``serving`` only from a node that does not serve yet, with a recovery record of checked fields;
  ``recovery_failed`` only from one that recovers;
* ``replan`` only from a replacement that recovers, naming the plan it was sent last; it is answered once per
  plan and at most ``max_attempts`` times per replacement (its own limit before it gives up).

A replacement's sources learn that it may fetch their weights (CONTROL ``grant``) when it is sent its plan, in
WELCOME or ``plan`` (checkfree.swarm.supervisor.link ``Link.grant``; the node's side is
checkfree.swarm.node.parts).

Two replicas of one stage must serve alike: a replacement that reports ``serving`` rebuilt by another plan
(rule, source stages, parts, fallback) than a replica of its stage that serves already, rebuilt in this
recovery, is killed (it raced a new plan); its slot is planned again, as a copy of that replica.

**What the handlers see.** The supervisor's state (checkfree.swarm.supervisor.state: the slots, the attempt in
progress, the iteration, the reports so far, the checkpoints stored), which they read and update, and three narrow
protocols: an :class:`Outbox` (WELCOME, ``peers``, ``checkpoint``, ``grant``, dialling a node), a :class:`Ledger`
(a crash's ``joined`` / ``served`` events and the nodes' statistics, for throughput.json) and the
:class:`Evidence` against misbehaving nodes. What only the supervisor's processes can do (kill a node, mark a
node dead that its launcher saw exit, start a launcher's nodes) they return as actions
(:class:`Action`), which the supervisor carries out after each message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from checkfree.swarm.launcher import LAUNCHER_ID_BASE, LAUNCHER_STAGE
from checkfree.swarm.reroute import node_of
from checkfree.swarm.supervisor.state import Attempt, Slot, SupervisorState
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

log = logging.getLogger(__name__)


class Outbox(Protocol):
    """Messages to nodes, and which fell silent (checkfree.swarm.supervisor.link.Link)."""

    def send(self, node: int, mtype: MessageType, meta: dict[str, Any]) -> None: ...

    def broadcast(self, command: str, **meta: Any) -> None: ...

    def grant(self, slot: Slot) -> None: ...

    def connect(self, node: int, address: str) -> None: ...

    def silent(self) -> set[int]: ...


class Ledger(Protocol):
    """What throughput.json records of the messages (checkfree.swarm.supervisor.results.Results)."""

    def joined(self, slot: Slot) -> None: ...

    def served(self, slot: Slot, record: dict[str, Any], background: bool = False) -> Any: ...

    def node_report(self, node: int, meta: dict[str, Any]) -> None: ...


class Evidence(Protocol):
    """The evidence against misbehaving nodes (checkfree.swarm.supervisor.conduct.Conduct)."""

    def offence(self, node: int, why: str) -> None: ...

    def reported(self, reporter: int, rejected_from: dict[str, int]) -> None: ...

    def accused(self, reporter: int, replicas: list[int]) -> None: ...


@dataclass(frozen=True)
class Action:
    """What a message asks of the supervisor's processes: ``kill`` the slot's occupant (``why``), mark it ``dead``
    (its launcher saw it exit: ``why``), or ``start`` the slot's initial node (a launcher took the slot)."""

    kind: str
    slot: Slot
    why: str = ""


Actions = list[Action]


class PeerMessages:
    """The supervisor's handlers of messages from peers.

    Args:
        state: the supervisor's state (module docstring). outbox: messages to nodes. ledger: what
            throughput.json records. evidence: every rejected message is an offence of its sender.
    """

    def __init__(self, state: SupervisorState, outbox: Outbox, ledger: Ledger, evidence: Evidence) -> None:
        self.state, self.outbox, self.ledger, self.evidence = state, outbox, ledger, evidence
        self.cfg, self.roster = state.cfg, state.roster
        self.clock = time.monotonic
        """Seconds (monotonic), the clock of the attempts' ``t_begin``; tests replace it."""
        self.bad_messages = 0
        """Peer messages that passed the wire format and schema but did not fit (dropped, counted)."""
        self.node_handlers: dict[MessageType, Callable[[Slot, Message], Actions]] = {
            MessageType.ITERATION_END: self._on_iteration_end,
            MessageType.CONTROL: self._on_node_control,
        }
        """Message type (from a slot's occupant) → handler; JOIN and launchers are routed before."""
        self.node_commands: dict[str, Callable[[Slot, dict[str, Any]], Actions]] = {
            "serving": self._on_serving,
            "stored": self._on_stored,
            "committed": self._on_committed,
            "final": self._on_report,
            "restored": self._on_restored,
            "ready": self._on_ready,
            "stalled": self._on_stalled,
            "recovery_failed": self._on_recovery_failed,
            "replan": self._on_replan,
            "resumed": self._on_resumed,
        }
        """CONTROL command from a node → handler."""

    def handle(self, msg: Message) -> Actions:
        """Route one (schema-checked) message through the handler tables; returns what the supervisor's processes
        must do about it. A message that does not fit (a ProtocolError from a handler) is logged and counted in
        ``bad_messages``, never raised."""
        try:
            if msg.type == MessageType.JOIN:
                return self._on_join(msg)
            if msg.sender in self.roster.launchers:
                return self._on_launcher_message(msg)
            slot = self.roster.by_node.get(msg.sender)
            if slot is None or slot.occupant != msg.sender:
                raise ProtocolError(f"node {msg.sender} is not a member of this swarm")
            handler = self.node_handlers.get(msg.type)
            if handler is None:
                raise ProtocolError(f"the supervisor takes no {msg.type.name} from a node")
            return handler(slot, msg)
        except ProtocolError as exc:
            self.bad_messages += 1
            self.evidence.offence(msg.sender, str(exc))
            log.warning("supervisor: dropped a %s from %d: %s", msg.type.name, msg.sender, exc)
            return []

    # ------------------------------------------------------------------ reports of one attempt

    def _claim(
        self, slot: Slot, command: str, attempt: int, stage0: bool = False, key: int | None = None
    ) -> Attempt | None:
        """The attempt a node's report of ``attempt`` belongs to; None for a stale report (an attempt that is over),
        which is ignored. The caller records it in ``reported`` once its own checks pass, under ``key`` (None: the
        node; an ITERATION_END: the pipeline's stage-0 node of ``begin``).

        Raises:
            ProtocolError: the attempt has not begun, the node is no member (no stage-0 member, with
                ``stage0``) of it, or it reported ``command`` in this attempt already.
        """
        current, node = self.state.current, slot.occupant
        if attempt > self.state.attempt:
            raise ProtocolError(
                f"{command!r} of attempt {attempt}, which has not begun (attempt {self.state.attempt})"
            )
        if current is None or attempt != current.number or current.phase == "over":
            return None
        if node not in (current.members.get(0, []) if stage0 else current.nodes()):
            raise ProtocolError(
                f"{command!r} of attempt {attempt} from node {node}, no {'stage-0 ' * stage0}member of it"
            )
        if (node if key is None else key) in current.reported.get(command, ()):
            raise ProtocolError(f"a second {command!r} of attempt {attempt}")
        return current

    def _take(
        self, current: Attempt, slot: Slot, meta: dict[str, Any], command: str, key: int | None = None
    ) -> Actions:
        key = slot.occupant if key is None else key
        current.reported.setdefault(command, set()).add(key)
        getattr(self.state.reports, command)[key] = meta
        return []

    def _pipeline_end_key(self, slot: Slot, meta: dict[str, Any]) -> int | None:
        """The key an ITERATION_END of the attempt in progress is filed under: the stage-0 node of ``begin`` of its
        pipeline (``pipeline``; without it, the sender's own). None: sent before a ``reroute`` moved the
        pipeline (stale, ignored), or the attempt is not the one in progress.

        Raises:
            ProtocolError: the routes do not give the pipeline to the sender (checkfree.swarm.reroute.node_of).
        """
        current = self.state.current
        if current is None or current.number != meta["attempt"] or current.phase == "over":
            return slot.occupant
        begun0 = current.begun.get(0) or current.members.get(0, [])
        p = meta.get("pipeline", begun0.index(slot.occupant) if slot.occupant in begun0 else -1)
        if not 0 <= p < len(begun0):
            raise ProtocolError(f"ITERATION_END of pipeline {p}; the attempt has {len(begun0)}")
        key = begun0[p]
        if meta.get("reroutes", 0) < current.need_end.get(key, 0):
            return None  # sent before its pipeline was re-routed: a new one follows
        begun = current.begun or current.members
        if node_of(p, 0, begun, current.members) != slot.occupant:
            raise ProtocolError(
                f"ITERATION_END of pipeline {p} from node {slot.occupant}, which does not drive it"
            )
        return key

    def _on_iteration_end(self, slot: Slot, msg: Message) -> Actions:
        meta = msg.meta
        if meta["attempt"] > self.state.attempt:
            raise ProtocolError(f"'iteration_end' of attempt {meta['attempt']}, which has not begun")
        key = self._pipeline_end_key(slot, meta)
        if key is None:
            return []
        current = self._claim(slot, "iteration_end", meta["attempt"], stage0=True, key=key)
        if current is None:
            return []
        if current.phase != "forward":
            raise ProtocolError(f"ITERATION_END in the {current.phase} phase")
        tokens = self.cfg.mb_count * self.cfg.model.batch_size * self.cfg.model.seq_l
        if meta["tokens"] != tokens:
            raise ProtocolError(f"ITERATION_END of {meta['tokens']} tokens; a pipeline runs {tokens}")
        return self._take(current, slot, meta, "iteration_end", key=key)

    def _on_stalled(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        """A stage-0 node's pipeline is stuck: the attempt is aborted and redone, if the claim can be true."""
        current = self._claim(slot, "stalled", meta["attempt"], stage0=True)
        if current is None:
            return []
        if slot.occupant in current.reported.get("iteration_end", ()):
            raise ProtocolError("'stalled' from a node whose pipeline ended in this attempt")
        elapsed = self.clock() - current.t_begin
        if elapsed < 0.99 * self.cfg.microbatch_timeout:  # 1 %: monotonic clocks of two machines
            raise ProtocolError(
                f"'stalled' {elapsed:.1f} s after begin; no microbatch can have been out for "
                f"microbatch_timeout ({self.cfg.microbatch_timeout:.0f} s)"
            )
        silent = sorted(set(current.nodes()) & self.outbox.silent())
        log.warning(
            "supervisor: node %d reports attempt %d stalled after %.1f s (%s); nodes silent: %s",
            slot.occupant,
            current.number,
            elapsed,
            meta["reason"][:200],
            silent or "none",
        )
        return self._take(current, slot, meta, "stalled")

    def _on_ready(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        current = self._claim(slot, "ready", meta["attempt"])
        if current is None:
            return []
        if current.phase == "forward":
            raise ProtocolError("'ready' before 'sync'")
        if not meta["pipelines"] <= self.cfg.replicas:
            raise ProtocolError(
                f"'ready' averaged {meta['pipelines']} pipelines; the swarm has {self.cfg.replicas}"
            )
        dropped = meta.get("rejected", [])
        replicas = set(current.members.get(slot.stage, [])) - {slot.occupant}
        if not set(dropped) <= replicas:
            raise ProtocolError(
                f"'ready' names {dropped[:8]} as dropped; its replicas are {sorted(replicas)}"
            )
        self.evidence.accused(slot.occupant, dropped)
        return self._take(current, slot, meta, "ready")

    def _on_committed(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        current = self._claim(slot, "committed", meta["attempt"])
        if current is None:
            return []
        if current.phase != "commit":
            raise ProtocolError(f"'committed' in the {current.phase} phase, before 'commit'")
        if meta["version"] != current.iteration + 1:
            raise ProtocolError(
                f"'committed' version {meta['version']}; committing iteration {current.iteration} gives "
                f"{current.iteration + 1}"
            )
        self._on_report(slot, meta)
        current.reported.setdefault("committed", set()).add(slot.occupant)
        return []

    # ------------------------------------------------------------------ recovery reports

    def _on_recovery_failed(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        if slot.serving:
            raise ProtocolError("'recovery_failed' from a node that serves")
        self.state.reports.recovery_failed[slot.occupant] = meta
        return []

    def _on_replan(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        """A recovering replacement asks for a new plan (answered in the recovering phase, checkfree.swarm.supervisor.phases.recovering)."""
        seq = meta["seq"]
        if slot.serving or slot.address is None:
            raise ProtocolError("'replan' from a node that does not recover")
        if seq > slot.plan_seq:
            raise ProtocolError(f"'replan' of plan {seq}; the node was sent plan {slot.plan_seq} last")
        if seq < slot.plan_seq:
            return []  # a newer plan is on its way to it already
        if slot.replans >= self.cfg.max_attempts:
            raise ProtocolError(f"'replan' after {slot.replans} new plans (max_attempts)")
        self.state.reports.replan[slot.occupant] = meta
        return []

    def _on_node_control(self, slot: Slot, msg: Message) -> Actions:
        command = msg.meta["command"]
        handler = self.node_commands.get(command)
        if handler is None:
            raise ProtocolError(f"command {command!r} is not for the supervisor")
        return handler(slot, msg.meta)

    def _plausible(self, version: int) -> None:
        """Raise ProtocolError if a peer's version is ahead of the iterations this supervisor has begun."""
        begun = self.state.begun_iteration
        if version > begun + 1:
            raise ProtocolError(f"version {version} is ahead of iteration {begun}")

    def _on_stored(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        if slot is not self.roster.storage or not 0 <= meta["stage"] <= self.cfg.n_stages:
            raise ProtocolError(f"'stored' of stage {meta['stage']} from a node that is not the storage node")
        self._plausible(meta["version"])
        self.state.checkpoints.record(meta["stage"], meta["version"])
        self.evidence.reported(slot.occupant, meta.get("rejected_from", {}))
        self.ledger.node_report(slot.occupant, meta)  # the storage node's counters so far
        return []

    def _on_report(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        """``committed`` / ``final``: the node's cumulative statistics (its ``rejected_from`` is evidence against
        their senders), and the version of the stage-0 copy a holder (stage 1 or S) holds, which the plan of a
        lost stage 0 needs."""
        if "version" in meta:
            self._plausible(meta["version"])
            slot.version_reported(version=meta["version"])
        if "stage0_copy" in meta:
            if slot.stage not in (1, self.cfg.n_stages):
                raise ProtocolError(f"a stage-0 copy reported by a stage-{slot.stage} node, which holds none")
            self._plausible(meta["stage0_copy"])
            slot.version_reported(copy_version=meta["stage0_copy"])
        self.evidence.reported(slot.occupant, meta.get("rejected_from", {}))
        self.ledger.node_report(slot.occupant, meta)
        reports = self.state.reports
        (reports.committed if meta["command"] == "committed" else reports.final)[slot.occupant] = meta
        return []

    def _on_resumed(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        """A node answers a resumed supervisor's ``resume``: a claim (its stage, version, attempt, the commit it
        awaits) that checkfree.swarm.supervisor.adoption weighs against the journal; taken once."""
        if slot.occupant in self.state.reports.resumed:
            raise ProtocolError("a second 'resumed'")
        self.evidence.reported(slot.occupant, meta.get("rejected_from", {}))
        if "sent_bytes" in meta:
            self.ledger.node_report(slot.occupant, meta)  # its counters so far, for throughput.json
        self.state.reports.resumed[slot.occupant] = meta
        return []

    def _on_restored(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        self._plausible(meta["version"])
        slot.version_reported(version=meta["version"])
        self.state.reports.restored[slot.occupant] = meta
        return []

    def _on_launcher_message(self, msg: Message) -> Actions:
        if msg.type != MessageType.CONTROL or msg.meta["command"] != "exited":
            raise ProtocolError(f"a launcher sends only CONTROL 'exited', not {msg.type.name}")
        slot = self.roster.by_node.get(msg.meta["node"])
        if slot is None or slot.occupant != msg.meta["node"] or slot.launcher != msg.sender:
            raise ProtocolError(
                f"launcher {msg.sender} reports node {msg.meta['node']}, which it does not host"
            )
        return [Action("dead", slot, f"process exited with code {msg.meta['code']}")]

    def _on_launcher(self, msg: Message) -> Actions:
        """Another machine's launcher offers to host slots; start their initial nodes there."""
        if msg.sender < LAUNCHER_ID_BASE or msg.sender in self.roster.launchers:
            raise ProtocolError(f"a launcher JOIN from id {msg.sender}, not a new launcher id")
        layout = self.state.keys.layout if self.state.keys is not None else None
        machine = layout.machine_of(msg.sender) if layout is not None else None
        if layout is not None and (machine is layout.own or machine.start in layout.revoked):
            raise ProtocolError(
                f"a launcher JOIN from id {msg.sender}, the launcher of no machine of this swarm"
            )
        slots = [
            n
            for n in msg.meta.get("slots", [])
            if 0 <= n < self.cfg.n_nodes
            and not self.roster.slots[n].local
            and self.roster.slots[n].launcher is None
            and (machine is None or machine.start <= n < machine.end)  # a machine hosts its own nodes only
        ]
        self._connect(msg.sender, msg.meta["address"])
        self.roster.launchers.add(msg.sender)
        self.roster.launcher_addresses[msg.sender] = msg.meta["address"]
        log.info("supervisor: launcher %d at %s hosts slots %s", msg.sender, msg.meta["address"], slots)
        for n in slots:
            self.roster.slots[n].hosted_by(msg.sender)
        return [Action("start", self.roster.slots[n]) for n in slots]

    def _connect(self, node: int, address: str) -> None:
        try:
            self.outbox.connect(node, address)
        except TransportError as exc:
            raise ProtocolError(f"address {address[:80]!r} cannot be dialled: {exc}") from None

    def _on_join(self, msg: Message) -> Actions:
        """A node (or launcher) introduces itself: only the expected occupant of a slot, once."""
        node, meta = msg.sender, msg.meta
        if meta["stage"] == LAUNCHER_STAGE:
            return self._on_launcher(msg)
        slot = self.roster.by_node.get(node)
        if slot is None and 0 <= node < self.cfg.n_nodes and not self.roster.slots[node].local:
            if self.roster.slots[node].launcher is None:
                raise ProtocolError(f"JOIN from node {node}, which no launcher hosts")
            slot = self.roster.slots[node]  # started by another machine's launcher
        if slot is None or slot.occupant != node or slot.stage != meta["stage"] or slot.dead:
            raise ProtocolError(f"JOIN from node {node} (stage {meta['stage']}): not expected")
        if slot.address is not None:
            raise ProtocolError(f"JOIN from node {node}, which joined already at {slot.address}")
        self._connect(node, meta["address"])
        self.roster.by_node[node] = slot
        slot.joined(meta["address"])
        self.ledger.joined(slot)
        welcome = control(
            "welcome",
            config=self.cfg.to_json(),
            setting=self.state.setting,
            peers=self.roster.peer_rows(),
            members={str(k): v for k, v in self.roster.members().items()},
            vocab_size=self.state.vocab_size,
            rank=slot.slot % self.cfg.replicas,
            checkpoint_version=self.state.checkpoints.newest_complete(),
            iteration=self.state.begun_iteration + 1,
            attempt=self.state.attempt,
            **self._keys(),
            **({"revoked": sorted(self.roster.revoked)} if self.roster.revoked else {}),
            **({"plan": slot.plan.to_json()} if slot.plan is not None else {}),
        )
        if meta.get("replacement"):
            self.outbox.grant(slot)  # before its WELCOME: the grant is on its way before any request
        self.outbox.send(node, MessageType.CONTROL, welcome)
        self.outbox.broadcast("peers", **self.roster.peers_fields(), **self._keys())
        log.info(
            "supervisor: node %d joined (stage %d, %s, %s)", node, slot.stage, slot.location, slot.address
        )
        return []

    def _keys(self) -> dict[str, Any]:
        """``keys``: the public keys nodes admit: every live occupant and each machine's next replacement ids
        (checkfree.swarm.wire.auth)."""
        keys = self.state.keys
        if keys is None:
            return {}
        admitted = keys.admitted(
            [s.occupant for s in self.roster.all()], self.roster.next_id, self.roster.revoked
        )
        return {"keys": {str(i): key for i, key in admitted.items()}}

    def _on_serving(self, slot: Slot, meta: dict[str, Any]) -> Actions:
        if slot.serving:
            raise ProtocolError("'serving' from a node that serves already")
        if meta["stage"] != slot.stage:
            raise ProtocolError(
                f"'serving' stage {meta['stage']} from the occupant of a stage-{slot.stage} slot"
            )
        self._plausible(meta["version"])
        background = self._in_background(slot)
        if background and not joinable(self.state, meta["version"]):
            self.state.candidates[slot.occupant] = meta["version"]  # joins at a boundary once current
            return []
        self.state.candidates.pop(slot.occupant, None)
        record = meta["record"]
        rebuilt = rebuilt_by(record)
        other = next(
            (
                s
                for s in self.roster.slots
                if s is not slot and s.stage == slot.stage and s.serving and s.rebuilt not in (None, rebuilt)
            ),
            None,
        )
        if rebuilt is not None and other is not None:
            why = (
                f"rebuilt by rule {record.get('rule')} from stages {record.get('source_stages')}, but node "
                f"{other.occupant} serves stage {slot.stage} rebuilt by {other.rebuilt[0]} from stages "
                f"{other.rebuilt[1]}"
            )
            return [Action("kill", slot, why)]
        restarted = slot.serves(meta["version"], rebuilt, storage=slot is self.roster.storage)
        if slot is self.roster.storage and restarted and self.state.commits:
            self.outbox.broadcast(
                "checkpoint", checkpoint_senders=[ids[0] for ids in self.roster.members().values() if ids]
            )
        if background:
            slot.starts_forgiven()  # as after a pausing recovery (phases.recovering ``Recovered``)
        phase = self.state.phase
        paused = phase is not None and phase.name in ("recovering", "recovered", "starting")
        crash = self.ledger.served(slot, record, background=background and self.state.training and not paused)
        if crash is not None:
            log.info(
                "supervisor: node %d serves stage %d again %.2f s after the crash (%s from %s)",
                slot.occupant,
                slot.stage,
                crash.latency_s,
                record["rule"],
                record.get("source_nodes"),
            )
        return []

    def _in_background(self, slot: Slot) -> bool:
        """Whether ``slot`` is a transformer-stage slot whose stage has another serving replica: its replacement
        recovers in the background and joins at an attempt boundary (issue 39 point 3; a stage-0 slot drives a
        pipeline of the global batch, so its replacement is waited for: ``Roster.background_only``)."""
        return (
            slot is not self.roster.storage
            and slot.stage != 0
            and any(s is not slot and s.stage == slot.stage and s.serving for s in self.roster.slots)
        )


def joinable(state: SupervisorState, version: int) -> bool:
    """Whether a replacement recovering in the background (issue 39 point 3) at weights ``version`` may join now:
    it holds every commit (``version`` is the committed iterations), and no attempt is in flight (its commit
    would leave the replacement one behind)."""
    current = state.current
    return version == state.iteration and (current is None or current.phase == "over")


def rebuilt_by(record: dict[str, Any]) -> tuple[Any, ...] | None:
    """(rule, source stages, parts, fallback) of a ``serving`` node's recovery record; None for an initial node
    and for exact copies (a live replica, a checkpoint), which cannot differ from their stage's other replicas."""
    rule = record.get("rule")
    if rule in (None, "initial", "replica", "storage"):
        return None
    stages, parts = record.get("source_stages"), record.get("parts")
    return (
        str(rule),
        tuple(stages) if isinstance(stages, list) else (),
        tuple(parts) if isinstance(parts, list) else (),
        str(record.get("fallback")),
    )
