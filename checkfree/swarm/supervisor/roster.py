"""The supervisor's view of the swarm: its slots and their occupants, and its messages to them.

A *slot* is a stage replica's place in the swarm (an initial node id, its stage and location); its
*occupant* is the node process serving it now (the initial node, then replacements with fresh ids).
:class:`Roster` holds every slot and answers who serves which stage; :class:`Link` sends to nodes and
keeps what they reported (``inbox``: command → node → meta) for the supervisor's waiting loops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.wire.control import control
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger("checkfree.swarm.supervisor.supervisor")

POLL_S = 0.005
"""Default wait of one :meth:`Link.poll`, seconds."""


class SwarmError(RuntimeError):
    """The swarm cannot make progress (a limit of retries was exceeded); the message says which."""


class Slot:
    """A stage replica's place in the swarm: an initial node id, its stage, location and current process."""

    def __init__(self, slot: int, stage: int, location: str, local: bool) -> None:
        self.slot, self.stage, self.location, self.local = slot, stage, location, local
        self.occupant = slot
        self.address: str | None = None
        self.serving = False
        self.dead = False
        self.version = 0
        self.tries = 0
        self.deadline = float("inf")
        self.launcher: int | None = None
        """Id of the launcher that hosts this slot on another machine (None: local or not yet known)."""
        self.plan: RecoveryPlan | None = None
        """How this slot's replacement rebuilds its stage: planned once per loss event by the supervisor, and
        again when a recovering replacement's sources are all gone (sent to it as CONTROL ``plan``)."""
        self.plan_seq = 0
        """How many new plans the occupant was sent after its WELCOME's (its ``replan`` names the one it runs)."""
        self.replans = 0
        """How many of the occupant's ``replan`` requests were answered (at most one per plan, at most
        ``max_attempts`` in all: checkfree.swarm.supervisor.inbox)."""
        self.rebuilt: tuple[Any, ...] | None = None
        """(rule, source stages, parts, fallback) the occupant was rebuilt by, unless it is an initial node or
        a copy of a live replica: two replicas of one stage must not serve rebuilt by different plans."""
        self.away = False
        """Kept down by a down-interval schedule (no replacement) until the schedule clock reaches ``back_at``
        (checkfree.swarm.supervisor.outages)."""
        self.back_at: int | None = None
        """The schedule iteration an away slot comes back (None: not within the schedule)."""
        self.copy_version: int | None = None
        """The version of the CheckFree+ stage-0 copy the occupant last reported holding (stages 1 and S;
        None: it reported none, e.g. a holder rebuilt since stage 0 last pushed its copies)."""


class Roster:
    """Every slot of the swarm (plus the storage node's, under ``checkpoint``) and who occupies it.

    Args:
        cfg: the topology. start, end: the initial node ids this machine starts (the rest join from
            launchers elsewhere). storage: whether the setting keeps a storage node.
    """

    def __init__(self, cfg: SwarmConfig, start: int, end: int, storage: bool) -> None:
        self.cfg = cfg
        table = cfg.location_table()
        self.slots = [
            Slot(n, cfg.stage_of(n), cfg.location_of(n, table), start <= n < end) for n in range(cfg.n_nodes)
        ]
        self.storage = Slot(cfg.storage_id, -1, cfg.storage_location, start == 0) if storage else None
        self.by_node: dict[int, Slot] = {}
        """Node id → its slot, for every node ever started (a dead occupant still maps to its slot)."""
        self.launchers: set[int] = set()
        """Ids of the other machines' launchers that joined."""
        self.next_id = cfg.first_replacement_id
        """The id the next replacement gets."""
        self.revoked: set[int] = set()
        """Evicted node ids, whose keys every process withdrew (checkfree.swarm.supervisor.conduct)."""

    def all(self) -> list[Slot]:
        """The stage slots, then the storage node's slot (if any)."""
        return self.slots + ([self.storage] if self.storage is not None else [])

    def members(self) -> dict[int, list[int]]:
        """Stage → the occupants that serve it now."""
        out: dict[int, list[int]] = {s: [] for s in range(self.cfg.n_stages + 1)}
        for slot in self.slots:
            if slot.serving:
                out[slot.stage].append(slot.occupant)
        return out

    def lost_stages(self) -> set[int]:
        """Stages with no serving replica."""
        return {stage for stage, nodes in self.members().items() if not nodes}

    def holding_stages(self) -> set[int]:
        """Stages with a serving replica that reported holding its stage-0 copy (CheckFree+, docs/paper.md §3)."""
        return {s.stage for s in self.slots if s.serving and s.copy_version is not None}

    def peer_rows(self) -> list[list[Any]]:
        """``[node, stage, location, address]`` of every live occupant that joined (the ``peers`` table)."""
        return [
            [s.occupant, s.stage, s.location, s.address]
            for s in self.all()
            if s.address is not None and not s.dead
        ]

    def peers_fields(self) -> dict[str, Any]:
        """The fields of a ``peers`` command: the peer table, and the evicted ids whose keys nodes withdraw."""
        return {"peers": self.peer_rows()} | ({"revoked": sorted(self.revoked)} if self.revoked else {})

    def all_serving(self) -> bool:
        """Every slot serves, except those the schedule keeps away."""
        return all(s.serving or s.away for s in self.all())


class Link:
    """The supervisor's messages to nodes, and what nodes reported back.

    Args:
        transport: the supervisor's transport. roster: whom ``broadcast`` reaches.
        handle: called on every received message (the supervisor's dispatcher; set before :meth:`poll`).
    """

    def __init__(self, transport: Transport, roster: Roster) -> None:
        self.transport, self.roster = transport, roster
        self.handle: Callable[[Message], None] = lambda msg: None
        self.police: Callable[[], None] = lambda: None
        """Called after each :meth:`poll` (the supervisor evicts misbehaving nodes there)."""
        self.inbox: dict[str, dict[int, dict[str, Any]]] = {}
        """CONTROL command → node → its meta: the reports the waiting loops look for."""

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

    def poll(self, timeout: float = POLL_S, police: bool = True) -> None:
        """Handle every message that arrives within ``timeout`` seconds (and those queued behind it), then (with
        ``police``) evict the nodes whose messages were rejected too often (:attr:`police`)."""
        msg = self.transport.recv(timeout)
        while msg is not None:
            self.handle(msg)
            msg = self.transport.recv(0)
        if police:
            self.police()

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

    def reported(self, command: str) -> dict[int, dict[str, Any]]:
        """Node → meta of the ``command`` reports received since the inbox was last cleared."""
        return self.inbox.get(command, {})
