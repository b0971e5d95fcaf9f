"""Membership of the swarm as one node sees it: joining (JOIN → WELCOME), the peer table, who serves which stage.

Used by every process that joins a swarm: a stage replica (checkfree.swarm.node.node) and the checkpoint storage node
(checkfree.swarm.storage).

* :func:`join` dials the bootstrap (the supervisor), sends JOIN (``stage``, ``location``, ``address``, …) and
  waits at most ``JOIN_TIMEOUT_S`` for the supervisor's WELCOME; other messages that arrive first go to the
  caller's ``early`` handler (a node keeps them) or are dropped.
* :class:`PeerSender` is the process's ``send``.
* :class:`Membership` holds the peer table (``peers``: id → stage, location, address, as the supervisor's
  ``peers`` rows list them) and the serving replicas of each stage (``members``, from WELCOME and ``begin``).
  :meth:`Membership.admit` applies a ``peers`` command: it admits the listed CURVE keys (and withdraws the
  ``revoked`` ones for good), dials new or moved peers (a node dials only the peers the supervisor lists), pins
  each to its WAN location, and forgets peers no longer listed (a stage replica; the storage node keeps them, so
  a late request of a removed node is still answered).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.netem import SwarmNetEm
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.wire.staging import HostStaging
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 120.0
"""Seconds a new node waits for the supervisor's WELCOME before it gives up."""


def advertised(transport: Transport, advertise_host: str | None) -> str:
    """The address peers dial: the transport's bound address, with ``advertise_host`` as host when given."""
    if not advertise_host:
        return transport.address
    return f"tcp://{advertise_host}:{transport.address.rsplit(':', 1)[1]}"


class PeerSender:
    """The ``send`` callable of a process (checkfree.swarm.node.context.Send): a message to a connected peer; a
    peer that is gone is logged (the supervisor handles the death). ``meta`` gets the sender's ``stage`` unless
    it is a CONTROL message or names one. With ``staging`` (a node on a GPU) the tensors leave as host bytes
    through its pinned buffer (checkfree.swarm.wire.staging), valid until the next send."""

    def __init__(
        self, transport: Transport, node_id: int, stage: int, staging: HostStaging | None = None
    ) -> None:
        self.transport, self.node_id, self.stage, self.staging = transport, node_id, stage, staging

    def __call__(
        self,
        peer: int,
        mtype: MessageType,
        iteration: int = -1,
        microbatch: int = -1,
        meta: dict[str, Any] | None = None,
        tensors: dict[str, torch.Tensor] | None = None,
    ) -> None:
        meta = meta if meta is not None else {}
        if mtype != MessageType.CONTROL:
            meta.setdefault("stage", self.stage)
        tensors = tensors or {}
        if self.staging is not None:
            tensors = self.staging.to_host(tensors)
        msg = Message(mtype, self.node_id, iteration, microbatch, meta, tensors)
        try:
            self.transport.send(peer, msg)
        except TransportError as exc:  # a peer gone meanwhile: the timeouts recover
            log.warning("node %d: could not send %s to %d: %s", self.node_id, mtype.name, peer, exc)


def configure_links(transport: Transport, cfg: SwarmConfig) -> SwarmNetEm:
    """Apply the WELCOME's config to the links: heartbeat period, peer timeout, and the WAN emulation of the
    config's location table and time scale (returned; the transport sends through it)."""
    transport.heartbeat_interval, transport.peer_timeout = cfg.heartbeat_interval, cfg.peer_timeout
    transport.netem = SwarmNetEm(cfg.location_table(), cfg.geo(), time_scale=cfg.time_scale)
    return transport.netem


def join(
    transport: Transport,
    bootstrap: str,
    node_id: int,
    meta: dict[str, Any],
    early: Callable[[Message], None] | None = None,
    timeout: float = JOIN_TIMEOUT_S,
) -> Message | None:
    """Introduce this process to the supervisor at ``bootstrap``; returns the WELCOME, or None on timeout.

    Args:
        meta: the JOIN's fields (``stage``, ``location``, ``address``, and ``replacement`` for a node).
        early: receives every other message that arrives before the WELCOME (None: dropped).
        timeout: seconds to wait for the WELCOME.
    """
    transport.connect(SUPERVISOR_ID, bootstrap)
    try:
        transport.send(SUPERVISOR_ID, Message(MessageType.JOIN, node_id, meta=meta))
    except TransportError as exc:  # the wait below times out and the caller exits
        log.warning("node %d: could not send JOIN to %s: %s", node_id, bootstrap, exc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = transport.recv(timeout=0.1)
        if msg is None:
            continue
        if msg.sender == SUPERVISOR_ID and msg.meta.get("command") == "welcome":
            return msg
        if early is not None:
            early(msg)
    return None


@dataclass
class Membership:
    """The peer table and the serving replicas of each stage, as the supervisor last listed them.

    Attributes:
        me: this process's node id (never its own peer).
        peers: peer id → ``{"stage", "location", "address"}``.
        members: stage → ids of its serving replicas (the supervisor's order).
        begun: the ``members`` of the attempt's ``begin`` once a ``reroute`` took some out (None: ``members``).
        forget_unlisted: a ``peers`` command drops peers it no longer lists (and their links).
    """

    me: int
    peers: dict[int, dict[str, Any]] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)
    begun: dict[int, list[int]] | None = None
    forget_unlisted: bool = True

    def serving(self, stage: int) -> list[int]:
        """The serving replicas of ``stage`` (empty when it has none)."""
        return self.members.get(stage, [])

    def stage_of(self, peer: int) -> int | None:
        """The stage the supervisor lists ``peer`` for, None if it is not listed."""
        entry = self.peers.get(peer)
        return None if entry is None else entry["stage"]

    def set_members(self, members: dict[str, list[int]]) -> None:
        """Take the ``members`` field of a WELCOME or ``begin`` (stage keys as strings, JSON)."""
        self.members = {int(s): list(ids) for s, ids in members.items()}
        self.begun = None

    def at_begin(self) -> dict[int, list[int]]:
        """The serving replicas of the attempt's ``begin`` (the routes' homes, checkfree.swarm.reroute)."""
        return self.members if self.begun is None else self.begun

    def rerouted(self, members: dict[str, list[int]]) -> None:
        """Take the ``members`` of a ``reroute``: the ``begin``'s, less the nodes that died since.

        Raises:
            ProtocolError: a stage lists a node its current list does not (a re-route only takes nodes out).
        """
        new = {int(s): list(ids) for s, ids in members.items()}
        for stage, ids in new.items():
            if not set(ids) <= set(self.members.get(stage, [])):
                raise ProtocolError(f"a reroute adds nodes to stage {stage}: {sorted(ids)[:8]}")
        if self.begun is None:
            self.begun = self.members
        self.members = {s: new.get(s, []) for s in self.members}

    def admit(self, meta: dict[str, Any], transport: Transport) -> None:
        """Apply a ``peers`` command (or a WELCOME): admit the listed keys, dial every listed peer
        (``[id, stage, location, address]`` rows) that is new or moved, and forget peers no longer listed."""
        if "keys" in meta and transport.identity is not None:
            transport.identity.keyring.update({int(k): v for k, v in meta["keys"].items()})
        if "revoked" in meta and transport.identity is not None:  # evicted nodes (checkfree.swarm.wire.auth)
            transport.identity.keyring.revoke(meta["revoked"])
        listed = set()
        for pid, stage, location, address in meta["peers"]:
            if pid == self.me or pid < 0:
                continue
            old = self.peers.get(pid)
            if old is None or old["address"] != address:
                try:
                    transport.connect(pid, address)
                except TransportError as exc:
                    log.warning("node %d: cannot dial peer %d: %s", self.me, pid, exc)
                    continue
                if transport.netem is not None:
                    transport.netem.set_location(pid, location)
            listed.add(pid)
            self.peers[pid] = {"stage": stage, "location": location, "address": address}
        if self.forget_unlisted:
            for pid in set(self.peers) - listed:
                self.peers.pop(pid)
                transport.disconnect(pid)
