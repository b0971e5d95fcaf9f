"""The checkpoint storage node of the ``checkpoint`` setting (docs/paper.md §5, §8).

Every ``checkpoint_every`` iterations one replica of each stage pushes its weights and Adam state here
(a CHECKPOINT message, meta ``version`` = iterations completed). The node keeps the two newest versions per
stage (a rollback needs a version every stage has, and the newest may still be in transit for some stage),
acknowledges each with CONTROL ``stored`` to the supervisor, and answers WEIGHTS_REQUEST ``{stage, version}``
with that snapshot (an ``error`` answer if it has none).

A checkpoint is stored only if it comes from a node the supervisor lists for that stage, its version is not
ahead of the iterations the supervisor has begun (``begin`` broadcasts), and every tensor is finite; anything
else is dropped and counted (``bad_messages``, and per sender in ``rejected_from``, the supervisor's evidence
for evicting a node: checkfree.swarm.supervisor.conduct), so a forged checkpoint can neither poison a rollback
nor evict a real version.

A snapshot is served only to a node the supervisor lists for that very stage (a replacement rebuilding it by
the ``storage`` rule, or a replica rolling back: no node learns a stage it does not hold), and to each requester
at most once per ``request_timeout`` / 2 seconds (a requester asks again only after ``request_timeout``): a
flood of requests gets at most two answers per ``request_timeout``, the rest is dropped and counted.

When the supervisor falls silent the storage node keeps what it holds and waits ``supervisor_grace`` seconds for a
resumed one (checkfree.swarm.node.supervisor_watch), which asks it (``resume``) for the versions it holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from checkfree.recovery.record import RecoveryRecord
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.node.membership import Membership, PeerSender, advertised, configure_links, join
from checkfree.swarm.node.supervisor_watch import SupervisorWatch
from checkfree.swarm.wire import control
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.auth import Identity
from checkfree.swarm.wire.netem import SwarmNetEm
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger(__name__)

KEEP_VERSIONS = 2


class StorageNode:
    """Holds stage snapshots in memory; serves them to replacements and rolling-back nodes."""

    def __init__(
        self,
        node_id: int,
        location: str,
        bootstrap: str,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.id, self.location, self.bootstrap = node_id, location, bootstrap
        self.netem = SwarmNetEm(time_scale=0.0)
        self.transport = Transport(
            node_id, bind_host=bind_host, netem=self.netem, identity=identity, validate=control.check
        )
        self.address = advertised(self.transport, advertise_host)
        self.send = PeerSender(self.transport, node_id, -1)
        self.snapshots: dict[int, dict[int, Message]] = {}
        self.membership = Membership(node_id, forget_unlisted=False)
        """Every peer the supervisor has listed, and the stage it lists it for (kept when unlisted: a request
        of a node removed meanwhile is still answered)."""
        self.max_version = 0
        self.bad_messages = 0
        self.rejected_from: dict[int, int] = {}
        """Messages dropped, per sender (reported with ``stored`` and ``final``)."""
        self.answered: dict[int, float] = {}
        """Requester → when it was last sent a snapshot (monotonic seconds)."""
        self.request_timeout = 60.0
        """The config's ``request_timeout`` (from the WELCOME)."""
        self.done = False
        self.watch = SupervisorWatch(f"storage {node_id}", grace=120.0)
        """Whether the supervisor is away (its grace: the WELCOME config's ``supervisor_grace``)."""
        self.handlers: dict[MessageType, Callable[[Message], None]] = {
            MessageType.CONTROL: self._on_control,
            MessageType.CHECKPOINT: self._store,
            MessageType.WEIGHTS_REQUEST: self._serve,
        }
        self.commands: dict[str, Callable[[dict[str, Any]], None]] = {
            "peers": self._peers,
            "begin": self._begin,
            "shutdown": self._shutdown,
            "resume": self._resume,
        }
        """Supervisor commands the storage node acts on; the others (sync, commit, ...) are not for it."""

    def run(self) -> int:
        try:
            t = self.transport
            meta = {"stage": -1, "location": self.location, "address": self.address}
            welcome = join(t, self.bootstrap, self.id, meta)
            if welcome is None:
                log.error("storage %d: no WELCOME from %s; exiting", self.id, self.bootstrap)
                return 3
            cfg = swarm_config_from_dict(welcome.meta["config"], "WELCOME config")
            self.netem = configure_links(t, cfg)
            self.request_timeout = cfg.request_timeout
            self.watch.grace = cfg.supervisor_grace
            self.max_version = welcome.meta["iteration"]
            self._peers(welcome.meta)
            record = RecoveryRecord(-1, "storage").to_json()  # the storage node (re)starts empty
            self.send(
                SUPERVISOR_ID,
                MessageType.CONTROL,
                meta=control.control("serving", stage=-1, version=0, record=record),
            )
            while not self.done:
                msg = t.recv(0.1)
                if msg is not None:
                    self.dispatch(msg)
                if self.watch.check(SUPERVISOR_ID in t.dead_peers()) == "expired":
                    return 3
            return 0
        finally:
            self.transport.close()

    def dispatch(self, msg: Message) -> None:
        """Route through the handler table; a message that does not fit is dropped and counted."""
        if self.watch.away and (msg.type != MessageType.CONTROL or msg.sender != SUPERVISOR_ID):
            self.watch.dropped += 1  # nothing but the supervisor's word while it is away
            return
        handler = self.handlers.get(msg.type)
        try:
            if handler is None:
                raise ProtocolError(f"the storage node takes no {msg.type.name}")
            handler(msg)
        except ProtocolError as exc:
            self.bad_messages += 1
            self.rejected_from[msg.sender] = self.rejected_from.get(msg.sender, 0) + 1
            log.warning("storage %d: dropped a %s from %d: %s", self.id, msg.type.name, msg.sender, exc)

    def _rejected_from(self) -> dict[str, int]:
        return {str(n): c for n, c in self.rejected_from.items()}

    def _on_control(self, msg: Message) -> None:
        if msg.sender != SUPERVISOR_ID:
            raise ProtocolError("CONTROL from a node; only the supervisor commands")
        handler = self.commands.get(msg.meta["command"])
        if handler is not None:
            handler(msg.meta)
            self.watch.heard()

    def _resume(self, meta: dict[str, Any]) -> None:
        """A resumed supervisor asks what this node holds (checkfree.swarm.supervisor.adoption)."""
        self.watch.back()
        stats = self.transport.stats
        answer = control.control(
            "resumed",
            stage=-1,
            version=0,
            serving=True,
            attempt=-1,
            pending=None,
            last_control_wall=self.watch.last_command_wall,
            sent_bytes=stats["sent_bytes"],
            sent_messages=stats["sent_messages"],
            dropped_malformed=stats["dropped_malformed"],
            bad_messages=self.bad_messages,
            rejected_from=self._rejected_from(),
            stored_versions=self._versions(),
            record=RecoveryRecord(-1, "storage").to_json(),
        )
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=answer)

    def _shutdown(self, meta: dict[str, Any]) -> None:
        stats = self.transport.stats
        final = control.control(
            "final",
            sent_bytes=stats["sent_bytes"],
            sent_messages=stats["sent_messages"],
            dropped_malformed=stats["dropped_malformed"],
            dropped_spoofed=stats["dropped_spoofed"],
            bad_messages=self.bad_messages,
            rejected_from=self._rejected_from(),
            stored_versions=self._versions(),
        )
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=final)
        time.sleep(0.3)
        self.done = True

    def _begin(self, meta: dict[str, Any]) -> None:
        self.max_version = max(self.max_version, meta["iteration"])

    def _peers(self, meta: dict[str, Any]) -> None:
        self.membership.admit(meta, self.transport)

    def _versions(self) -> dict[str, list[int]]:
        return {str(s): sorted(v) for s, v in self.snapshots.items()}

    def _store(self, msg: Message) -> None:
        stage, version = msg.meta["stage"], msg.meta["version"]
        if self.membership.stage_of(msg.sender) != stage:
            raise ProtocolError(f"a stage-{stage} checkpoint from node {msg.sender}, which does not hold it")
        if version > self.max_version + 1:
            raise ProtocolError(f"checkpoint version {version} is ahead of iteration {self.max_version}")
        W.check_finite(msg.tensors, f"node {msg.sender}")
        if not msg.tensors or any(not k.startswith(("w.", "m.", "v.")) for k in msg.tensors):
            raise ProtocolError("a checkpoint holds only w.*, m.* and v.* tensors")
        kept = self.snapshots.setdefault(stage, {})
        kept[version] = msg
        for old in sorted(kept)[:-KEEP_VERSIONS]:
            del kept[old]
        nbytes = sum(x.numel() * x.element_size() for x in msg.tensors.values())
        log.info(
            "storage %d: stored stage %d version %d (%d bytes) from node %d",
            self.id,
            stage,
            version,
            nbytes,
            msg.sender,
        )
        meta = control.control(
            "stored",
            stage=stage,
            version=version,
            bytes=nbytes,
            bad_messages=self.bad_messages,
            rejected_from=self._rejected_from(),
        )
        self.send(SUPERVISOR_ID, MessageType.CONTROL, meta=meta)

    def _serve(self, msg: Message) -> None:
        if msg.sender not in self.membership.peers and msg.sender != SUPERVISOR_ID:
            raise ProtocolError(
                f"a weights request from node {msg.sender}, which the supervisor has not listed"
            )
        stage, version = msg.meta["stage"], msg.meta.get("version")
        if msg.sender != SUPERVISOR_ID:
            if self.membership.stage_of(msg.sender) != stage:
                raise ProtocolError(
                    f"a request for stage {stage} from node {msg.sender}, which does not hold it"
                )
            last = self.answered.get(msg.sender)
            if last is not None and time.monotonic() - last < self.request_timeout / 2:
                raise ProtocolError(
                    f"node {msg.sender} was answered {time.monotonic() - last:.1f} s ago; at most once per "
                    f"{self.request_timeout / 2:.0f} s"
                )
        snap = self.snapshots.get(stage, {}).get(version) if version is not None else None
        reply: dict[str, Any] = {"stage": stage, "request": msg.meta["request"]}
        if snap is None:
            reply["error"] = f"no checkpoint of stage {stage} at version {version}"
            self.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=reply)
            return
        meta = dict(snap.meta) | reply
        tensors: dict[str, torch.Tensor] = snap.tensors
        if not msg.meta.get("optimizer"):
            tensors = {k: v for k, v in tensors.items() if k.startswith("w.")}
        self.answered[msg.sender] = time.monotonic()
        self.send(msg.sender, MessageType.WEIGHTS_RESPONSE, meta=meta, tensors=tensors)
