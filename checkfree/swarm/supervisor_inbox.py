"""The supervisor's side of every peer message: dispatch tables and the checks only the supervisor can make.

A message reaching these handlers has passed the wire format, the sender binding (CURVE) and its schema
(checkfree.swarm.control). :meth:`PeerMessages._handle` routes it: JOIN first (a node or a launcher introduces
itself), then launchers' reports, then, for the current occupant of a slot, the handler of its message type
(``node_handlers``) and CONTROL command (``node_commands``). A handler that finds a message implausible (a
version ahead of the iterations begun, a JOIN for a slot that joined already, an address libzmq refuses, a
``stored`` from a node that is not the storage node) raises ``ProtocolError``; ``_handle`` logs it and counts it
in ``bad_messages`` and never lets it out: one message cannot stop the supervisor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from checkfree.swarm.auth import KEY_WINDOW, SwarmKeys
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.control import control
from checkfree.swarm.launcher import LAUNCHER_ID_BASE, LAUNCHER_STAGE
from checkfree.swarm.protocol import Message, MessageType, ProtocolError
from checkfree.swarm.results import Results
from checkfree.swarm.transport import Transport, TransportError

if TYPE_CHECKING:
    from checkfree.swarm.supervisor_roster import Slot

log = logging.getLogger("checkfree.swarm.supervisor")


class PeerMessages:
    """Mixin of :class:`checkfree.swarm.supervisor.Supervisor`: the handlers of messages from peers."""

    cfg: SwarmConfig
    setting: str
    vocab_size: int
    keys: SwarmKeys | None
    transport: Transport
    results: Results
    slots: list[Slot]
    storage: Slot | None
    by_node: dict[int, Slot]
    launchers: set[int]
    next_id: int
    stored: dict[int, set[int]]
    inbox: dict[str, dict[int, dict[str, Any]]]
    bad_messages: int
    node_handlers: dict[MessageType, Callable[[Slot, Message], None]]
    node_commands: dict[str, Callable[[Slot, dict[str, Any]], None]]

    # provided by the Supervisor
    def _all_slots(self) -> list[Slot]: ...
    def _members(self) -> dict[int, list[int]]: ...
    def _peer_rows(self) -> list[list[Any]]: ...
    def _send(self, node: int, mtype: MessageType, meta: dict[str, Any]) -> None: ...
    def _broadcast(self, command: str, **meta: Any) -> None: ...
    def _spawn(self, slot: Slot, replacement: bool) -> None: ...
    def _mark_dead(self, slot: Slot, why: str) -> None: ...
    def _complete_checkpoint(self) -> int: ...

    def _handle(self, msg: Message) -> None:
        """Route one (schema-checked) message through the handler tables; a message that does not fit (a
        ProtocolError from a handler) is logged and counted in ``bad_messages``, never raised."""
        try:
            if msg.type == MessageType.JOIN:
                self._on_join(msg)
            elif msg.sender in self.launchers:
                self._on_launcher_message(msg)
            else:
                slot = self.by_node.get(msg.sender)
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
        self.inbox.setdefault("iteration_end", {})[msg.sender] = msg.meta

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
        if slot is not self.storage or not 0 <= meta["stage"] <= self.cfg.n_stages:
            raise ProtocolError(f"'stored' of stage {meta['stage']} from a node that is not the storage node")
        self._plausible(meta["version"])
        self.stored.setdefault(meta["stage"], set()).add(meta["version"])
        self.results.node_report(slot.occupant, meta)  # the storage node's counters so far

    def _on_report(self, slot: Slot, meta: dict[str, Any]) -> None:
        """``committed`` / ``final``: the node's cumulative statistics."""
        if "version" in meta:
            self._plausible(meta["version"])
            slot.version = meta["version"]
        self.results.node_report(slot.occupant, meta)
        self.inbox.setdefault(meta["command"], {})[slot.occupant] = meta

    def _on_restored(self, slot: Slot, meta: dict[str, Any]) -> None:
        self._plausible(meta["version"])
        slot.version = meta["version"]
        self.inbox.setdefault("restored", {})[slot.occupant] = meta

    def _to_inbox(self, slot: Slot, meta: dict[str, Any]) -> None:
        """``ready`` / ``stalled`` / ``recovery_failed``: kept for the waiting loop."""
        self.inbox.setdefault(meta["command"], {})[slot.occupant] = meta

    def _on_launcher_message(self, msg: Message) -> None:
        if msg.type != MessageType.CONTROL or msg.meta["command"] != "exited":
            raise ProtocolError(f"a launcher sends only CONTROL 'exited', not {msg.type.name}")
        slot = self.by_node.get(msg.meta["node"])
        if slot is None or slot.occupant != msg.meta["node"] or slot.launcher != msg.sender:
            raise ProtocolError(
                f"launcher {msg.sender} reports node {msg.meta['node']}, which it does not host"
            )
        self._mark_dead(slot, f"process exited with code {msg.meta['code']}")

    def _on_launcher(self, msg: Message) -> None:
        """Another machine's launcher offers to host slots; start their initial nodes there."""
        if msg.sender < LAUNCHER_ID_BASE or msg.sender in self.launchers:
            raise ProtocolError(f"a launcher JOIN from id {msg.sender}, not a new launcher id")
        slots = [
            n
            for n in msg.meta.get("slots", [])
            if 0 <= n < self.cfg.n_nodes and not self.slots[n].local and self.slots[n].launcher is None
        ]
        self._connect(msg.sender, msg.meta["address"])
        self.launchers.add(msg.sender)
        log.info("supervisor: launcher %d at %s hosts slots %s", msg.sender, msg.meta["address"], slots)
        for n in slots:
            self.slots[n].launcher = msg.sender
            self._spawn(self.slots[n], replacement=False)

    def _connect(self, node: int, address: str) -> None:
        try:
            self.transport.connect(node, address)
        except TransportError as exc:
            raise ProtocolError(f"address {address[:80]!r} cannot be dialled: {exc}") from None

    def _on_join(self, msg: Message) -> None:
        """A node (or launcher) introduces itself: only the expected occupant of a slot, once."""
        node, meta = msg.sender, msg.meta
        if meta["stage"] == LAUNCHER_STAGE:
            self._on_launcher(msg)
            return
        slot = self.by_node.get(node)
        if slot is None and 0 <= node < self.cfg.n_nodes and not self.slots[node].local:
            if self.slots[node].launcher is None:
                raise ProtocolError(f"JOIN from node {node}, which no launcher hosts")
            slot = self.slots[node]  # started by another machine's launcher
        if slot is None or slot.occupant != node or slot.stage != meta["stage"] or slot.dead:
            raise ProtocolError(f"JOIN from node {node} (stage {meta['stage']}): not expected")
        if slot.address is not None:
            raise ProtocolError(f"JOIN from node {node}, which joined already at {slot.address}")
        self._connect(node, meta["address"])
        self.by_node[node] = slot
        slot.address = meta["address"]
        if slot.crash is not None:
            slot.crash["t_join"] = self.results.now()
        welcome = control(
            "welcome",
            config=self.cfg.to_json(),
            setting=self.setting,
            peers=self._peer_rows(),
            members={str(k): v for k, v in self._members().items()},
            vocab_size=self.vocab_size,
            rank=slot.slot % self.cfg.replicas,
            checkpoint_version=self._complete_checkpoint(),
            iteration=self.results.current_iteration + 1,
            epoch=self.epoch,
            **self._keys(),
            **({"plan": slot.plan.to_json()} if slot.plan is not None else {}),
        )
        self._send(node, MessageType.CONTROL, welcome)
        self._broadcast("peers", peers=self._peer_rows(), **self._keys())
        log.info(
            "supervisor: node %d joined (stage %d, %s, %s)", node, slot.stage, slot.location, slot.address
        )

    def _keys(self) -> dict[str, Any]:
        """``keys``: the public keys nodes admit: every live occupant and the next replacement ids."""
        if self.keys is None:
            return {}
        ids = [s.occupant for s in self._all_slots()] + list(range(self.next_id, self.next_id + KEY_WINDOW))
        return {"keys": {str(i): self.keys.public_key(i) for i in ids}}

    def _on_serving(self, slot: Slot, meta: dict[str, Any]) -> None:
        if meta["stage"] != slot.stage:
            raise ProtocolError(
                f"'serving' stage {meta['stage']} from the occupant of a stage-{slot.stage} slot"
            )
        self._plausible(meta["version"])
        slot.serving, slot.version = True, meta["version"]
        slot.deadline = float("inf")
        if slot is self.storage and slot.crash is not None and self.results.rows:
            self._broadcast(
                "checkpoint", checkpoint_senders=[ids[0] for ids in self._members().values() if ids]
            )
        if slot.crash is not None:
            slot.crash.update(self.results.served(slot.crash, meta["record"]))
            self.results.crashes.append(slot.crash)
            log.info(
                "supervisor: node %d serves stage %d again %.2f s after the crash (%s from %s)",
                slot.occupant,
                slot.stage,
                slot.crash["latency_s"],
                meta["record"].get("rule"),
                meta["record"].get("sources"),
            )
            slot.crash = None
