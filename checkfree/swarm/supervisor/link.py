"""The supervisor's messages to nodes, and the messages it receives (docs/paper.md §8).

:class:`Link` sends CONTROL commands (each checked against its schema, checkfree.swarm.wire.control) to one node,
to every live occupant of the roster, or, for a replacement's plan, to the nodes of its source stages (``grant``).
It hands received messages to whoever asks (:meth:`Link.recv`): the supervisor's loop, which routes them.
"""

from __future__ import annotations

import logging
from typing import Any

from checkfree.swarm.supervisor.state import Roster, Slot
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger(__name__)


class Link:
    """The supervisor's messages to nodes.

    Args:
        transport: the supervisor's transport. roster: whom ``broadcast`` reaches.
    """

    def __init__(self, transport: Transport, roster: Roster) -> None:
        self.transport, self.roster = transport, roster

    def send(self, node: int, mtype: MessageType, meta: dict[str, Any]) -> None:
        """Send ``meta`` to ``node``; a node that is gone is logged, not raised."""
        try:
            self.transport.send(node, Message(mtype, SUPERVISOR_ID, meta=meta))
        except TransportError as exc:
            log.warning("supervisor: could not send %s to %d: %s", mtype.name, node, exc)

    def command(self, to: int, command: str, **meta: Any) -> None:
        """Send CONTROL ``command`` (schema-checked) to node or launcher ``to``."""
        self.send(to, MessageType.CONTROL, control(command, **meta))

    def broadcast(self, command: str, **meta: Any) -> None:
        """Send CONTROL ``command`` to every live occupant that joined."""
        msg = control(command, **meta)
        for slot in self.roster.all():
            if slot.address is not None and not slot.dead:
                self.send(slot.occupant, MessageType.CONTROL, msg)

    def connect(self, node: int, address: str) -> None:
        """Dial ``node`` at ``address``.

        Raises:
            TransportError: libzmq refuses the address.
        """
        self.transport.connect(node, address)

    def disconnect(self, node: int) -> None:
        """Close the connection to ``node`` (it is gone)."""
        self.transport.disconnect(node)

    def admit(self, keys: dict[int, str]) -> None:
        """Admit these node ids' public keys to the supervisor's keyring (CURVE; nothing with plain TCP)."""
        if self.transport.identity is not None:
            self.transport.identity.keyring.update(keys)

    def revoke(self, node: int) -> None:
        """Withdraw ``node``'s key from the supervisor's keyring: its messages are dropped from now on."""
        if self.transport.identity is not None:
            self.transport.identity.keyring.revoke([node])

    def silent(self) -> set[int]:
        """The peers silent for ``peer_timeout`` seconds (heartbeat failure detection)."""
        return self.transport.dead_peers()

    def recv(self, timeout: float) -> Message | None:
        """The next received message (schema-checked by the transport), waiting at most ``timeout`` seconds."""
        return self.transport.recv(timeout)

    def grant(self, slot: Slot) -> None:
        """Tell the serving nodes of every source stage of ``slot``'s plan that its occupant may fetch their
        weights (or the stage-0 part they hold) once under this plan (CONTROL ``grant``; a node answers no
        other request, checkfree.swarm.node.parts). The storage node needs none: it serves a node only the
        checkpoint of the stage the supervisor lists it for (checkfree.swarm.storage)."""
        plan = slot.plan
        if plan is None or plan.rule == "storage":
            return
        members = self.roster.members()
        for i, stage in enumerate(plan.sources):
            part = plan.parts[i] if plan.parts else None
            meta = control(
                "grant",
                requester=slot.occupant,
                stage=0 if part is not None else stage,
                optimizer=plan.with_optimizer,
                seq=slot.plan_seq,
                **({"part": part} if part is not None else {}),
            )
            for node in members.get(stage, []):
                self.send(node, MessageType.CONTROL, meta)
