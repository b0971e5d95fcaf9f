"""One swarm node = one process = one stage replica: join, serve microbatches, average gradients, recover.

Life of a node (``python -m checkfree.swarm.node.node --id N --stage S --location L --bootstrap ADDR
--key-file FILE``; ``--insecure`` instead of the key file for plain TCP):

1. **Join** (checkfree.swarm.node.membership): JOIN to the supervisor; its WELCOME carries the swarm config, the
   peer table and the checkpoint version; the node dials every peer (full mesh, WAN-emulated) and builds its
   stage and parts (checkfree.swarm.node.parts).
2. **Recover** (replacements only, ``--replacement``): execute the plan the supervisor sent in the WELCOME
   (checkfree.recovery.planner; a replacement never re-plans), send WEIGHTS_REQUEST to a serving node of each
   source stage (or the storage node), combine the
   answers with the shared recovery math (``copy_state`` / ``weighted_average``) and report ``serving``.
   A rejected or error answer, or a source that leaves the peer table, sends the request to the next
   candidate at once; an unanswered one after ``request_timeout``; after ``max_attempts`` rounds the node
   reports ``recovery_failed`` and exits (the supervisor retries). When every source is gone it asks the
   supervisor (``replan``), which sends a new plan (``plan``; also unasked, when a loss event changes it).
3. **Iterate**, driven by the supervisor's CONTROL commands, one *attempt* per try at an iteration
   (checkfree.swarm.node.iteration): ``begin`` → forward/backward of every microbatch → ``sync`` (the replicas
   average their gradients, checkfree.swarm.node.gradient_sync) → ``commit`` (Adam step) → ``committed``.
   Between two attempts, ``evaluate`` runs the validation batches through the pipeline forward only, stages in
   order (checkfree.swarm.node.validation).
4. **Serve weights** at any time to a peer the supervisor lists (a request from one not yet listed waits,
   bounded, for the next ``peers``; the node never dials an unlisted requester): WEIGHTS_REQUEST →
   WEIGHTS_RESPONSE with the weights, the last gradient norm, and (if asked) Adam's moments, step and lr.
   Under ``ours-plus`` stage 0 also pushes its embedding and head to stages 1 and S after each step, and those
   serve the copies to a stage-0 replacement (checkfree.swarm.node.stage0_copies).
5. **Leave** on ``shutdown`` (final stats to the supervisor). A node whose supervisor falls silent keeps its
   stage and Adam state, drops the attempt in flight, does nothing else, and waits ``supervisor_grace`` seconds
   for a resumed supervisor (``resume``, checkfree.swarm.node.supervisor_watch) before it exits by itself: a
   node never outlives its swarm for good.

The node is small state objects (checkfree.swarm.node.context, the peer table of checkfree.swarm.node.membership) and
parts that each receive them in one :class:`~checkfree.swarm.node.context.NodeContext` (its id, stage, attempt clock,
peer table and ``send``). Every message passes the wire format and its schema
(checkfree.swarm.wire.control) in the transport; the dispatch tables (``handlers`` by message type, ``commands`` by
CONTROL command, from the supervisor only) route it. A peer message that still makes no sense (a wrong stage, a
bad shape, NaN weights, an implausible attempt or version) raises ``ProtocolError``, is logged and counted in
``bad_messages``, and the node keeps serving. FORWARD / BACKWARD pass the data plane's checks first
(checkfree.swarm.node.relay: finite values, on the received host bytes; the sender and route the attempt
assigns); what they refuse is also counted in ``rejected`` (``nonfinite``, ``off_route``), with the
gradients dropped by checkfree.swarm.node.gradient_sync (``gradients``). Any other exception is a bug: the node exits non-zero with the
traceback in its log, and the supervisor replaces it like any crash.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from checkfree.recovery.planner import RecoveryPlan
from checkfree.recovery.record import RecoveryRecord
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.devices import prepare_device
from checkfree.swarm.node.catch_up import CatchUp, UpdateKeeper, answer_update_request
from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.iteration import IterationCommands
from checkfree.swarm.node.membership import Membership, PeerSender, advertised, configure_links, join
from checkfree.swarm.node.parts import (
    Verdict,
    answer_weights_request,
    build_parts,
    refuse_weights_request,
    send_checkpoint,
)
from checkfree.swarm.node.recovering import Recovery, Rollback
from checkfree.swarm.node.relay import check_pipeline_message, check_route
from checkfree.swarm.node.supervisor_watch import SupervisorWatch
from checkfree.swarm.node.validation import NodeValidation
from checkfree.swarm.policies import make_policy
from checkfree.swarm.storage import StorageNode
from checkfree.swarm.wire import control
from checkfree.swarm.wire.auth import Identity, read_key_file
from checkfree.swarm.wire.netem import SwarmNetEm
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError, Rejected
from checkfree.swarm.wire.staging import HostStaging
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger(__name__)

HOST_CHECKED = frozenset({MessageType.FORWARD, MessageType.BACKWARD, MessageType.VALIDATION})
"""Types whose tensors are checked on the received host bytes before they go to the node's device."""
MAX_WAITING_REQUESTS = 64
"""WEIGHTS_REQUESTs from peers not yet listed (or before serving) kept at most; a flood of them is dropped."""


class Node:
    """A stage replica. Args: ids and addresses as on the command line; ``cache_dir``: data cache;
    ``identity``: its CURVE keypair and keyring (None: unauthenticated, ``--insecure``)."""

    def __init__(
        self,
        node_id: int,
        stage: int,
        location: str,
        bootstrap: str,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        replacement: bool = False,
        cache_dir: Path | None = None,
        identity: Identity | None = None,
        device: str = "cpu",
    ):
        self.device = prepare_device(device)  # cpu, or cuda:N (checkfree.swarm.devices)
        self.staging = HostStaging(
            self.device
        )  # device tensors <-> host bytes (checkfree.swarm.wire.staging)
        self.id, self.stage, self.location = node_id, stage, location
        self.bootstrap, self.replacement = bootstrap, replacement
        self.cache_dir = cache_dir
        self.netem = SwarmNetEm(time_scale=0.0)
        self.transport = Transport(
            node_id, bind_host=bind_host, netem=self.netem, identity=identity, validate=control.check
        )
        self.address = advertised(self.transport, advertise_host)
        send = PeerSender(self.transport, node_id, stage, self.staging)
        self.ctx = NodeContext(node_id, stage, AttemptClock(), Membership(node_id), send)
        """What every part of this node shares: its id and stage, attempt clock, peer table and ``send``."""
        self.waiting = FutureBuffer(MAX_WAITING_REQUESTS, MAX_WAITING_REQUESTS * 1024, per_sender=4)
        """WEIGHTS_REQUESTs that arrived before this node serves or before the supervisor listed the sender."""
        self.state: StageState
        """The stage replica it trains (built from the WELCOME's config)."""
        self.serving = False
        self.served_record: dict[str, Any] = {}
        """The recovery record this node reported ``serving`` with (a resumed supervisor asks for it again)."""
        self.done = False
        self.bad_messages = 0
        self.rejected_from: dict[int, int] = {}
        """Messages dropped by :meth:`reject`, per sender (evidence for the supervisor, ``rejected_from``)."""
        self.rejected = {"nonfinite": 0, "off_route": 0}
        """FORWARD / BACKWARD refused by the data plane's checks (checkfree.swarm.node.relay), by counter."""
        self.task: Recovery | Rollback | None = None
        self.keeper = UpdateKeeper()
        """The last updates of this replica, for replacements that catch up (checkfree.swarm.node.catch_up)."""
        self.catch_up: CatchUp | None = None
        """A replacement's catch-up with the commits it missed while it copied (issue 39 point 3)."""
        self.committed_seen = 0
        """The swarm's committed iterations as far as this node knows from the ``commit`` commands it saw (those
        before it joined are in the copy it fetches: its source had stepped them)."""
        self.watch = SupervisorWatch(f"node {node_id}", grace=120.0)
        """Whether the supervisor is away (its grace: the WELCOME config's ``supervisor_grace``)."""
        self.handlers: dict[MessageType, Callable[[Message], None]] = {
            MessageType.FORWARD: self._on_pipeline,
            MessageType.BACKWARD: self._on_pipeline,
            MessageType.GRADIENTS: lambda msg: self.parts.gradients.on_gradients(msg),
            MessageType.WEIGHTS_REQUEST: self._on_weights_request,
            MessageType.WEIGHTS_RESPONSE: self._on_weights_response,
            MessageType.CONTROL: self._on_control,
            MessageType.STAGE0_COPY: lambda msg: self.parts.stage0_copies.on_copy(msg),
            MessageType.VALIDATION: lambda msg: self.validation.on_message(msg),
        }
        """Message type → handler; JOIN / LEAVE / ITERATION_END / CHECKPOINT addressed to a node are dropped."""
        self.commands: dict[str, Callable[[dict[str, Any]], None]] = {
            "peers": self._on_peers,
            "grant": self._on_grant,
            "plan": self._on_plan,
            "rollback": self._rollback,
            "shutdown": self._shutdown,
            "resume": self._on_resume,
        }
        """CONTROL command (from the supervisor only) → handler; the iteration's (checkfree.swarm.node.iteration) are
        added once the node is set up."""

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> int:
        """Join, (recover,) serve until shutdown; returns the process exit code.

        A bug (any exception but the protocol's validation error) propagates: the process exits non-zero
        with the traceback in its log, and the supervisor replaces it like any crash.
        """
        try:
            meta = {
                "stage": self.stage,
                "location": self.location,
                "address": self.address,
                "replacement": self.replacement,
            }
            welcome = join(self.transport, self.bootstrap, self.id, meta, self._keep_early)
            if welcome is None:
                log.error("node %d: no WELCOME from %s; exiting", self.id, self.bootstrap)
                return 3
            self._setup(welcome.meta)
            if self.replacement:
                try:  # the supervisor planned this loss event once; a replacement never re-plans
                    plan = RecoveryPlan.from_json(welcome.meta.get("plan"), self.cfg.n_stages)
                except ValueError as exc:
                    self.give_up(f"the WELCOME holds no usable recovery plan ({exc})")
                    time.sleep(0.5)  # let the report leave
                    return 4
                # the iteration the loss event interrupted seeds a random rule, as in the simulator
                self.fetch.iteration = max(welcome.meta["iteration"] - 1, 0)
                checkpoint = welcome.meta["checkpoint_version"]
                self.task = Recovery(self.fetch, plan, self.state, self.recovered, self.give_up, checkpoint)
                self.task.start()
            else:
                self._serve(RecoveryRecord(self.stage, "initial").to_json())  # no recovery: the first node
            while not self.done:
                msg = self.transport.recv(timeout=0.05)
                if msg is not None:
                    self.dispatch(msg)
                if self._tick():
                    return 3
            return 0
        finally:
            self.transport.close()

    def _keep_early(self, msg: Message) -> None:
        """A message before the WELCOME: kept for later (a weights request, or a FORWARD of the next attempt)."""
        early = self.waiting if msg.type == MessageType.WEIGHTS_REQUEST else self.ctx.clock.future
        try:
            early.add(msg)
        except ProtocolError as exc:
            self.reject(msg, str(exc))

    def _setup(self, meta: dict[str, Any]) -> None:
        self.cfg = cfg = swarm_config_from_dict(meta["config"], "WELCOME config")
        self.watch.grace = cfg.supervisor_grace
        self.policy = make_policy(meta["setting"])
        self.netem = configure_links(self.transport, cfg)
        ctx = self.ctx
        ctx.clock.max_version = meta["iteration"]
        # the supervisor's last begun attempt: a peer's FORWARD for the next one may arrive before our "begin"
        ctx.clock.attempt = meta["attempt"]
        self._on_peers(meta)
        ctx.membership.set_members(meta["members"])
        parts = build_parts(ctx, cfg, self.policy, meta, self.cache_dir, self.reject, self.device)
        self.parts, self.state, self.worker, self.fetch = parts, parts.state, parts.worker, parts.fetch
        self.steps = IterationCommands(
            ctx,
            parts,
            self.dispatch,
            lambda: self.serving,
            self.send_checkpoint,
            self.report,
            self.keeper,
            self._missed_commit,
        )
        self.commands |= self.steps.table()
        self.validation = NodeValidation.for_node(
            ctx,
            cfg,
            self.state,
            int(meta["vocab_size"]),
            self.cache_dir,
            lambda: self.serving,
            self.dispatch,
            self.staging.to_device,
        )  # the validations of the pipeline, forward only (checkfree.swarm.node.validation)
        self.commands |= self.validation.table()
        where = f"stage {self.stage} at {self.location}, {self.address}, {len(ctx.membership.peers)} peers"
        log.info("node %d: %s, setting %s", self.id, where, self.policy.name)

    def _serve(self, record: dict[str, Any]) -> None:
        self.serving, self.served_record = True, record
        self.task = None
        meta = control.control("serving", stage=self.stage, version=self.state.version, record=record)
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, meta=meta)
        self._replay_requests()

    def _tick(self) -> bool:
        """Timeouts; True when the node must exit (its supervisor is gone for ``supervisor_grace`` seconds)."""
        seen = self.watch.check(SUPERVISOR_ID in self.transport.dead_peers())
        if seen == "lost":  # keep the stage and Adam, drop the attempt in flight, wait for a resumed one
            self.steps.hold()
        if seen == "expired":
            return True
        if self.watch.away:
            return False  # no training, no recovery without a supervisor
        if self.task is not None:
            self.task.tick()
        if self.catch_up is not None:
            self.catch_up.tick()
        self._expire_requests()
        for driver in self.steps.drivers():
            driver.tick()
        return False

    # ------------------------------------------------------------------ messaging

    def _on_peers(self, meta: dict[str, Any]) -> None:
        """Admit the listed keys and peers (checkfree.swarm.node.membership); then answer requests that were waiting
        for their sender to be listed, and move a fetch away from a source that left."""
        self.ctx.membership.admit(meta, self.transport)
        if self.serving:
            self._replay_requests()
        if self.task is not None:
            self.task.peers_changed()

    def _replay_requests(self) -> None:
        for msg in self.waiting.take(lambda m: m.sender in self.ctx.membership.peers):
            self.dispatch(msg)

    def dispatch(self, msg: Message) -> None:
        """Route one message through the handler table; a message a handler rejects (ProtocolError: nonsense
        from a peer) is logged and counted in ``bad_messages``. Any other exception is a bug: it propagates."""
        if self.watch.away and (msg.type != MessageType.CONTROL or msg.sender != SUPERVISOR_ID):
            self.watch.dropped += 1  # nothing but the supervisor's word while it is away
            return
        handler = self.handlers.get(msg.type)
        if handler is None:
            self.reject(msg, f"a node takes no {msg.type.name}")
            return
        if msg.type not in HOST_CHECKED:  # compute (and recovery math) where the stage lives
            msg.tensors = self.staging.to_device(msg.tensors)
        try:
            handler(msg)
        except Rejected as exc:
            self.rejected[exc.counter] += 1
            self.reject(msg, str(exc))
        except ProtocolError as exc:
            self.reject(msg, str(exc))

    def reject(self, msg: Message, why: str) -> None:
        """Count and log a peer message that does not fit (the node keeps serving)."""
        self.bad_messages += 1
        self.rejected_from[msg.sender] = self.rejected_from.get(msg.sender, 0) + 1
        log.warning("node %d: dropped a %s from %d: %s", self.id, msg.type.name, msg.sender, why)

    # ------------------------------------------------------------------ iterations

    def _on_pipeline(self, msg: Message) -> None:
        """A FORWARD / BACKWARD: checked on the received host bytes (shape, finite values), kept for its attempt
        if that is ahead, checked against the attempt's route (checkfree.swarm.node.relay), then computed on."""
        path, pos, key, tensor = check_pipeline_message(msg, self.cfg)
        clock, membership = self.ctx.clock, self.ctx.membership
        if not self.serving or clock.attempt_of(msg) is None:
            return
        if clock.waits_for_reroute(msg, self.cfg.replicas * (self.cfg.n_stages + 1)):
            return
        members = membership.members
        check_route(msg, path, pos, self.cfg, members, self.policy.swaps, self.id, membership.at_begin())
        msg.tensors = self.staging.to_device(msg.tensors)
        name = "activations" if msg.type == MessageType.FORWARD else "gradients"
        self.steps.handler_of(key[0]).on_message(msg, path, pos, key, msg.tensors[name])

    def _on_plan(self, meta: dict[str, Any]) -> None:
        """The supervisor's new recovery plan (checkfree.swarm.node.recovering: sources all gone, or the stage
        planned anew); one that arrives after this node serves is too late and ignored."""
        if self.serving:
            log.info("node %d: a new recovery plan arrived after this node serves; ignored", self.id)
            return
        if not isinstance(self.task, Recovery) or isinstance(self.task, Rollback):
            raise ProtocolError("a new recovery plan, but this node is not recovering")
        try:
            plan = RecoveryPlan.from_json(meta["plan"], self.cfg.n_stages)
        except ValueError as exc:
            raise ProtocolError(f"the new recovery plan is unusable ({exc})") from None
        self.task.replan(plan, meta["members"], meta["seq"])

    def _rollback(self, meta: dict[str, Any]) -> None:
        if meta["version"] > self.ctx.clock.max_version:
            raise ProtocolError(f"rollback to version {meta['version']}, beyond {self.ctx.clock.max_version}")
        self.task = Rollback(self.fetch, meta["version"], self.state, self.restored, self.give_up)
        self.task.start()

    def report(self) -> dict[str, Any]:
        """Cumulative stats for the supervisor: bytes per message type, compute seconds, bad messages."""
        stats = self.transport.stats
        return {
            "sent_bytes": stats["sent_bytes"],
            "sent_messages": stats["sent_messages"],
            "dropped_malformed": stats["dropped_malformed"],
            "dropped_spoofed": stats["dropped_spoofed"],
            "bad_messages": self.bad_messages,
            "rejected_from": {str(n): c for n, c in self.rejected_from.items()},
            "rejected": {**self.rejected, "gradients": self.parts.gradients.rejected_count},
            "compute": {**self.worker.compute, "step_cpu_s": self.steps.step_s},
            "version": self.state.version,
            **self.parts.stage0_copies.report(),
            **({"refused_requests": dict(self.parts.grants.refused)} if self.parts.grants.refused else {}),
            **self._refused_connections(),
        }

    def _refused_connections(self) -> dict[str, int]:
        """``refused_connections``: the handshakes this node's ZAP check refused (an unknown or revoked key)."""
        identity = self.transport.identity
        refused = identity.keyring.refusals.refused if identity is not None else 0
        return {"refused_connections": refused} if refused else {}

    # ------------------------------------------------------------------ weights and checkpoints

    def send_checkpoint(self) -> None:
        """Ship weights + Adam state to the storage node (asynchronous: the send never blocks)."""
        send_checkpoint(self.ctx, self.state, self.cfg.storage_id)

    def _on_weights_request(self, msg: Message) -> None:
        """Answer a listed peer that the supervisor granted it, or tell it at once why not
        (checkfree.swarm.node.parts); a request from a peer the supervisor has not listed yet, before this node
        serves, or under a plan whose grant has not come yet, waits (the next ``peers``, ``serving`` or ``grant``
        replays it; :meth:`_expire_requests` refuses or drops it after a few seconds): a node dials only the
        peers the supervisor lists."""
        if "update" in msg.meta:
            self._on_update_request(msg)
            return
        listed = msg.sender in self.ctx.membership.peers or msg.sender == SUPERVISOR_ID
        verdict = self.parts.grants.judge(msg) if self.serving and listed else None
        if verdict is None or verdict.action == "wait":
            self.waiting.add(msg)
        elif verdict.action == "serve":
            answer_weights_request(self.ctx, msg, self.state, self.parts.stage0_copies, self.parts.grants)
        else:
            refuse_weights_request(self.ctx, msg, self.parts.grants, verdict, self.reject)

    def _expire_requests(self) -> None:
        """Requests that waited the grants' wait (checkfree.swarm.node.parts ``GRANT_WAIT_S``): a listed peer is
        refused ``no_grant`` (it moves on), a sender the supervisor never listed is dropped and counted. The
        supervisor's own requests wait for this node to serve."""
        grants = self.parts.grants
        for msg in self.waiting.take(lambda m: m.sender != SUPERVISOR_ID and grants.overdue(m)):
            grants.forget(msg)
            if msg.sender in self.ctx.membership.peers:
                why = f"no grant for node {msg.sender} came within {grants.wait_s:.0f} s"
                refuse_weights_request(self.ctx, msg, grants, Verdict("refuse", "no_grant", why), self.reject)
            else:
                self.reject(
                    msg, f"a weights request from node {msg.sender}, which the supervisor did not list"
                )

    def _on_grant(self, meta: dict[str, Any]) -> None:
        """The supervisor lets a replacement fetch this node's stage once (checkfree.swarm.node.parts)."""
        self.parts.grants.grant(meta)
        if self.serving:
            self._replay_requests()

    def _on_update_request(self, msg: Message) -> None:
        """A replacement of this stage asks for the update of one iteration (checkfree.swarm.node.catch_up).

        Raises:
            ProtocolError: the sender is no listed peer of this stage.
        """
        if self.ctx.membership.stage_of(msg.sender) != self.stage:
            raise ProtocolError(
                f"an update request from node {msg.sender}, no listed peer of stage {self.stage}"
            )
        if not (self.serving and self.steps.member()):
            meta = {"request": msg.meta["request"], "update": msg.meta["update"], "error": "not_serving"}
            self.ctx.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=meta)
            return
        answer_update_request(self.ctx, msg, self.state, self.keeper)

    def _on_weights_response(self, msg: Message) -> None:
        if self.catch_up is not None and self.catch_up.owns(msg):
            self.catch_up.on_response(msg)
            return
        if self.task is None:
            raise ProtocolError("a weights answer, but this node is not fetching weights")
        self.task.on_response(msg)

    def recovered(self, rebuilt: StageState, record: dict[str, Any]) -> None:
        """A finished Recovery: adopt the rebuilt stage, catch up with the commits made since its copy (a
        replacement recovering in the background, issue 39 point 3), and serve."""
        self.state.adopt(rebuilt)
        self.keeper.clear()
        self.task, self.served_record = None, record
        if record.get("rule") != "replica":  # only a copy of a live replica can be stepped like it
            self._serve(record)
            return
        self._catch_up_to(self.committed_seen)

    def _catch_up_to(self, target: int) -> None:
        """Report ``serving`` once the weights' version reaches ``target``, applying the missed updates first."""
        if self.catch_up is not None and not self.catch_up.finished:
            self.catch_up.extend(target)
            return
        if self.state.version >= target:
            self._serve(self.served_record)
            return
        self.catch_up = CatchUp(
            self.ctx, self.cfg, self.state, target, self.reject, self._caught_up, self.give_up
        )
        self.catch_up.start()

    def _caught_up(self) -> None:
        assert self.catch_up is not None
        log.info(
            "node %d: caught up to version %d (%d updates)",
            self.id,
            self.state.version,
            self.catch_up.applied,
        )
        self.catch_up = None
        self._serve(self.served_record)

    def _missed_commit(self, iteration: int) -> None:
        """The swarm committed ``iteration`` in an attempt this node is no member of: catch up with it and report
        ``serving`` again at the new version (the supervisor adds it at the next ``begin`` once current)."""
        self.committed_seen = max(self.committed_seen, iteration + 1)
        self.ctx.clock.max_version = max(self.ctx.clock.max_version, self.committed_seen)
        if self.task is not None or self.served_record.get("rule") != "replica":
            return  # still copying (it catches up once the copy is in), or not a copy of a live replica
        self._catch_up_to(self.committed_seen)

    def restored(self, rebuilt: StageState, record: dict[str, Any]) -> None:
        """A finished Rollback: adopt the checkpoint and report to the supervisor."""
        self.state.adopt(rebuilt)
        self.keeper.clear()
        self.task = None
        meta = control.control("restored", version=record["version"], bytes=record["bytes"], record=record)
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, meta=meta)

    def give_up(self, reason: str) -> None:
        log.error("node %d: %s", self.id, reason)
        self.ctx.send(
            SUPERVISOR_ID, MessageType.CONTROL, meta=control.control("recovery_failed", reason=reason)
        )
        self.task = None

    # ------------------------------------------------------------------ supervisor commands

    def _on_control(self, msg: Message) -> None:
        if msg.sender != SUPERVISOR_ID:
            raise ProtocolError("CONTROL from a node; only the supervisor commands")
        command = msg.meta["command"]
        handler = self.commands.get(command)
        if handler is None:
            raise ProtocolError(f"command {command!r} is not for a node")
        handler(msg.meta)
        self.watch.heard()

    def _on_resume(self, meta: dict[str, Any]) -> None:
        """A resumed supervisor asks where this node is (checkfree.swarm.supervisor.adoption): drop the attempt in
        flight but keep gradients that await a ``commit``, and answer with the stage, the weights' version, whether
        it serves, the attempt it was in and the one whose ``commit`` it awaits (CONTROL ``resumed``). The CURVE
        key this answer travels under is the node's proof of identity."""
        pending = self.steps.hold()
        self.watch.back()
        answer = {
            **self.report(),
            "stage": self.stage,
            "version": self.state.version,
            "serving": self.serving,
            "attempt": self.ctx.clock.attempt,
            "pending": pending,
            "last_control_wall": self.watch.last_command_wall,
            **({"record": self.served_record} if self.serving else {}),
        }
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, meta=control.control("resumed", **answer))

    def _shutdown(self, meta: dict[str, Any]) -> None:
        self.ctx.send(SUPERVISOR_ID, MessageType.CONTROL, meta=control.control("final", **self.report()))
        deadline = time.monotonic() + 3.0
        while self.transport.stats["sent_messages"]["CONTROL"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # let the sender thread hand the last frames to libzmq
        self.done = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m checkfree.swarm.node.node", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--id", type=int, required=True, help="this node's id (>= 0)")
    parser.add_argument(
        "--stage", type=int, required=True, help="stage it holds (0 = embedding/head; -1 = storage)"
    )
    parser.add_argument("--location", required=True, help="its location in the WAN table")
    parser.add_argument("--bootstrap", required=True, help="the supervisor's address, tcp://HOST:PORT")
    parser.add_argument("--bind-host", default="127.0.0.1", help="interface to listen on")
    parser.add_argument("--advertise-host", help="host name peers should dial (when binding 0.0.0.0)")
    parser.add_argument(
        "--replacement", action="store_true", help="recover the stage from peers before serving"
    )
    parser.add_argument("--cache-dir", type=Path, help="data cache of stage-0 nodes")
    parser.add_argument(
        "--key-file", type=Path, help="this node's CURVE key file (checkfree.swarm.wire.auth)"
    )
    parser.add_argument(
        "--insecure", action="store_true", help="plain TCP, no authentication (single-machine debugging)"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (checkfree.swarm.devices)")
    args = parser.parse_args(argv)
    if (args.key_file is None) == (not args.insecure):
        parser.error("give exactly one of --key-file FILE and --insecure")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s node{args.id} %(levelname)s %(name)s: %(message)s",
    )
    torch.set_num_threads(1)
    # Ctrl-C in a terminal reaches the whole process group: a node leaves when its supervisor says so (or falls
    # silent), so that the supervisor can still gather the model from it (checkfree.swarm.supervisor.model_io).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    identity = None if args.insecure else read_key_file(args.key_file, args.id)
    if args.stage == -1:
        where = (args.location, args.bootstrap, args.bind_host, args.advertise_host)
        return StorageNode(args.id, *where, identity).run()
    node = Node(
        args.id,
        args.stage,
        args.location,
        args.bootstrap,
        args.bind_host,
        args.advertise_host,
        args.replacement,
        args.cache_dir,
        identity,
        args.device,
    )
    return node.run()


if __name__ == "__main__":
    sys.exit(main())
