"""The supervisor's side of every peer message: dispatch tables and the checks only the supervisor can make.

A message reaching these handlers has passed the wire format, the sender binding (CURVE) and its schema
(checkfree.swarm.wire.control). :meth:`PeerMessages.handle` routes it: JOIN first (a node or a launcher introduces
itself), then launchers' reports, then, for the current occupant of a slot, the handler of its message type
(``node_handlers``) and CONTROL command (``node_commands``). A handler that finds a message implausible (a
version ahead of the iterations begun, a JOIN for a slot that joined already, an address libzmq refuses, a
``stored`` from a node that is not the storage node) raises ``ProtocolError``; ``handle`` logs it and counts it
in ``bad_messages`` and never lets it out: one message cannot stop the supervisor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.launcher import LAUNCHER_ID_BASE, LAUNCHER_STAGE
from checkfree.swarm.supervisor.checkpoints import Checkpoints
from checkfree.swarm.supervisor.processes import Processes
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.roster import Link, Roster, Slot
from checkfree.swarm.wire.auth import KEY_WINDOW, SwarmKeys
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

log = logging.getLogger("checkfree.swarm.supervisor.supervisor")


class PeerMessages:
    """The supervisor's handlers of messages from peers, with the parts of the supervisor they act on.

    Args:
        cfg, setting, vocab_size: what WELCOME tells a node. keys: the swarm's keys (None: plain TCP).
        roster, link, checkpoints, processes, results: the supervisor's parts (checkfree.swarm.supervisor.supervisor).
        epoch: the current epoch (WELCOME carries it).
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        setting: str,
        vocab_size: int,
        keys: SwarmKeys | None,
        roster: Roster,
        link: Link,
        checkpoints: Checkpoints,
        processes: Processes,
        results: Results,
        epoch: Callable[[], int],
    ) -> None:
        self.cfg, self.setting, self.vocab_size, self.keys = cfg, setting, vocab_size, keys
        self.roster, self.link, self.checkpoints, self.processes = roster, link, checkpoints, processes
        self.results, self.epoch = results, epoch
        self.bad_messages = 0
        """Peer messages that passed the wire format and schema but did not fit (dropped, counted)."""
        self.node_handlers: dict[MessageType, Callable[[Slot, Message], None]] = {
            MessageType.ITERATION_END: self._on_iteration_end,
            MessageType.CONTROL: self._on_node_control,
        }
        """Message type (from a slot's occupant) → handler; JOIN and launchers are routed before."""
        self.node_commands: dict[str, Callable[[Slot, dict[str, Any]], None]] = {
            "serving": self._on_serving,
            "stored": self._on_stored,
            "committed": self._on_report,
            "final": self._on_report,
            "restored": self._on_restored,
            "ready": self._to_inbox,
            "stalled": self._to_inbox,
            "recovery_failed": self._to_inbox,
        }
        """CONTROL command from a node → handler."""

    def handle(self, msg: Message) -> None:
        """Route one (schema-checked) message through the handler tables; a message that does not fit (a
        ProtocolError from a handler) is logged and counted in ``bad_messages``, never raised."""
        try:
            if msg.type == MessageType.JOIN:
                self._on_join(msg)
            elif msg.sender in self.roster.launchers:
                self._on_launcher_message(msg)
            else:
                slot = self.roster.by_node.get(msg.sender)
                if slot is None or slot.occupant != msg.sender:
                    raise ProtocolError(f"node {msg.sender} is not a member of this swarm")
                handler = self.node_handlers.get(msg.type)
                if handler is None:
                    raise ProtocolError(f"the supervisor takes no {msg.type.name} from a node")
                handler(slot, msg)
        except ProtocolError as exc:
            self.bad_messages += 1
            log.warning("supervisor: dropped a %s from %d: %s", msg.type.name, msg.sender, exc)

    def _on_iteration_end(self, slot: Slot, msg: Message) -> None:
        if slot.stage != 0:
            raise ProtocolError(f"ITERATION_END from a stage-{slot.stage} node")
        self.link.inbox.setdefault("iteration_end", {})[msg.sender] = msg.meta

    def _on_node_control(self, slot: Slot, msg: Message) -> None:
        command = msg.meta["command"]
        handler = self.node_commands.get(command)
        if handler is None:
            raise ProtocolError(f"command {command!r} is not for the supervisor")
        handler(slot, msg.meta)

    def _plausible(self, version: int) -> None:
        """Raise ProtocolError if a peer's version is ahead of the iterations this supervisor has begun."""
        if version > self.results.current_iteration + 1:
            raise ProtocolError(f"version {version} is ahead of iteration {self.results.current_iteration}")

    def _on_stored(self, slot: Slot, meta: dict[str, Any]) -> None:
        if slot is not self.roster.storage or not 0 <= meta["stage"] <= self.cfg.n_stages:
            raise ProtocolError(f"'stored' of stage {meta['stage']} from a node that is not the storage node")
        self._plausible(meta["version"])
        self.checkpoints.record(meta["stage"], meta["version"])
        self.results.node_report(slot.occupant, meta)  # the storage node's counters so far

    def _on_report(self, slot: Slot, meta: dict[str, Any]) -> None:
        """``committed`` / ``final``: the node's cumulative statistics."""
        if "version" in meta:
            self._plausible(meta["version"])
            slot.version = meta["version"]
        self.results.node_report(slot.occupant, meta)
        self.link.inbox.setdefault(meta["command"], {})[slot.occupant] = meta

    def _on_restored(self, slot: Slot, meta: dict[str, Any]) -> None:
        self._plausible(meta["version"])
        slot.version = meta["version"]
        self.link.inbox.setdefault("restored", {})[slot.occupant] = meta

    def _to_inbox(self, slot: Slot, meta: dict[str, Any]) -> None:
        """``ready`` / ``stalled`` / ``recovery_failed``: kept for the waiting loop."""
        self.link.inbox.setdefault(meta["command"], {})[slot.occupant] = meta

    def _on_launcher_message(self, msg: Message) -> None:
        if msg.type != MessageType.CONTROL or msg.meta["command"] != "exited":
            raise ProtocolError(f"a launcher sends only CONTROL 'exited', not {msg.type.name}")
        slot = self.roster.by_node.get(msg.meta["node"])
        if slot is None or slot.occupant != msg.meta["node"] or slot.launcher != msg.sender:
            raise ProtocolError(
                f"launcher {msg.sender} reports node {msg.meta['node']}, which it does not host"
            )
        self.processes.mark_dead(slot, f"process exited with code {msg.meta['code']}")

    def _on_launcher(self, msg: Message) -> None:
        """Another machine's launcher offers to host slots; start their initial nodes there."""
        if msg.sender < LAUNCHER_ID_BASE or msg.sender in self.roster.launchers:
            raise ProtocolError(f"a launcher JOIN from id {msg.sender}, not a new launcher id")
        slots = [
            n
            for n in msg.meta.get("slots", [])
            if 0 <= n < self.cfg.n_nodes
            and not self.roster.slots[n].local
            and self.roster.slots[n].launcher is None
        ]
        self._connect(msg.sender, msg.meta["address"])
        self.roster.launchers.add(msg.sender)
        log.info("supervisor: launcher %d at %s hosts slots %s", msg.sender, msg.meta["address"], slots)
        for n in slots:
            self.roster.slots[n].launcher = msg.sender
            self.processes.spawn(self.roster.slots[n], replacement=False)

    def _connect(self, node: int, address: str) -> None:
        try:
            self.link.transport.connect(node, address)
        except TransportError as exc:
            raise ProtocolError(f"address {address[:80]!r} cannot be dialled: {exc}") from None

    def _on_join(self, msg: Message) -> None:
        """A node (or launcher) introduces itself: only the expected occupant of a slot, once."""
        node, meta = msg.sender, msg.meta
        if meta["stage"] == LAUNCHER_STAGE:
            self._on_launcher(msg)
            return
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
        slot.address = meta["address"]
        self.results.joined(slot)
        welcome = control(
            "welcome",
            config=self.cfg.to_json(),
            setting=self.setting,
            peers=self.roster.peer_rows(),
            members={str(k): v for k, v in self.roster.members().items()},
            vocab_size=self.vocab_size,
            rank=slot.slot % self.cfg.replicas,
            checkpoint_version=self.checkpoints.newest_complete(),
            iteration=self.results.current_iteration + 1,
            epoch=self.epoch(),
            **self._keys(),
            **({"plan": slot.plan.to_json()} if slot.plan is not None else {}),
        )
        self.link.send(node, MessageType.CONTROL, welcome)
        self.link.broadcast("peers", peers=self.roster.peer_rows(), **self._keys())
        log.info(
            "supervisor: node %d joined (stage %d, %s, %s)", node, slot.stage, slot.location, slot.address
        )

    def _keys(self) -> dict[str, Any]:
        """``keys``: the public keys nodes admit: every live occupant and the next replacement ids."""
        if self.keys is None:
            return {}
        ids = [s.occupant for s in self.roster.all()] + list(
            range(self.roster.next_id, self.roster.next_id + KEY_WINDOW)
        )
        return {"keys": {str(i): self.keys.public_key(i) for i in ids}}

    def _on_serving(self, slot: Slot, meta: dict[str, Any]) -> None:
        if meta["stage"] != slot.stage:
            raise ProtocolError(
                f"'serving' stage {meta['stage']} from the occupant of a stage-{slot.stage} slot"
            )
        self._plausible(meta["version"])
        slot.serving, slot.version = True, meta["version"]
        slot.deadline = float("inf")
        restarted = self.results.open_crash(slot) is not None
        if slot is self.roster.storage and restarted and self.results.rows:
            self.link.broadcast(
                "checkpoint", checkpoint_senders=[ids[0] for ids in self.roster.members().values() if ids]
            )
        crash = self.results.served(slot, meta["record"])
        if crash is not None:
            log.info(
                "supervisor: node %d serves stage %d again %.2f s after the crash (%s from %s)",
                slot.occupant,
                slot.stage,
                crash.latency_s,
                crash.rule,
                crash.sources,
            )
