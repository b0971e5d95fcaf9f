"""The checkpoint storage node of the ``checkpoint`` setting (SPEC §5, §8).

Every ``checkpoint_interval`` iterations one replica of each stage pushes its weights and Adam state here
(a WEIGHTS_RESPONSE with meta ``checkpoint`` = version, i.e. iterations completed). The node keeps the two
newest versions per stage (a rollback needs a version every stage has, and the newest may still be in
transit for some stage), acknowledges each with CONTROL ``stored`` to the supervisor, and answers
WEIGHTS_REQUEST ``{stage, version}`` with that snapshot (an ``error`` answer if it has none).
"""

from __future__ import annotations

import logging
import time

import torch

from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.transport import Transport, TransportError

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
    ) -> None:
        from checkfree.swarm.node import SwarmNetEm

        self.id, self.location, self.bootstrap = node_id, location, bootstrap
        self.netem = SwarmNetEm(time_scale=0.0)
        self.transport = Transport(node_id, bind_host=bind_host, netem=self.netem)
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.snapshots: dict[int, dict[int, Message]] = {}
        self.known: dict[int, str] = {}

    def run(self) -> int:
        from checkfree.swarm.config import swarm_config_from_dict
        from checkfree.swarm.node import JOIN_TIMEOUT_S, SwarmNetEm

        try:
            t = self.transport
            t.connect(SUPERVISOR_ID, self.bootstrap)
            self._send(
                SUPERVISOR_ID,
                Message(
                    MessageType.JOIN,
                    self.id,
                    meta={"stage": -1, "location": self.location, "address": self.address},
                ),
            )
            deadline, welcome = time.monotonic() + JOIN_TIMEOUT_S, None
            while welcome is None and time.monotonic() < deadline:
                msg = t.recv(0.1)
                if msg is not None and msg.type == MessageType.CONTROL and msg.meta["command"] == "welcome":
                    welcome = msg
            if welcome is None:
                log.error("storage %d: no WELCOME within %.0f s; exiting", self.id, JOIN_TIMEOUT_S)
                return 3
            cfg = swarm_config_from_dict(welcome.meta["config"], "WELCOME config")
            t.heartbeat_interval, t.peer_timeout = cfg.heartbeat_interval, cfg.peer_timeout
            self.netem = SwarmNetEm(cfg.location_table(), cfg.geo(), time_scale=cfg.time_scale)
            t.netem = self.netem
            self._peers(welcome.meta["peers"])
            self._send(
                SUPERVISOR_ID,
                Message(
                    MessageType.CONTROL,
                    self.id,
                    meta={"command": "serving", "stage": -1, "version": 0, "record": {"rule": "storage"}},
                ),
            )
            while SUPERVISOR_ID not in t.dead_peers():
                msg = t.recv(0.1)
                if msg is None:
                    continue
                if msg.type == MessageType.CONTROL and msg.sender == SUPERVISOR_ID:
                    if msg.meta["command"] == "shutdown":
                        self._send(
                            SUPERVISOR_ID,
                            Message(
                                MessageType.CONTROL,
                                self.id,
                                meta={
                                    "command": "final",
                                    "sent_bytes": t.stats["sent_bytes"],
                                    "sent_messages": t.stats["sent_messages"],
                                    "stored_versions": self._versions(),
                                },
                            ),
                        )
                        time.sleep(0.3)
                        return 0
                    if msg.meta["command"] == "peers":
                        self._peers(msg.meta["peers"])
                elif msg.type == MessageType.WEIGHTS_RESPONSE and "checkpoint" in msg.meta:
                    self._store(msg)
                elif msg.type == MessageType.WEIGHTS_REQUEST:
                    self._serve(msg)
            log.error("storage %d: the supervisor is gone; exiting", self.id)
            return 3
        finally:
            self.transport.close()

    def _send(self, peer: int, msg: Message) -> None:
        try:
            self.transport.send(peer, msg)
        except (TransportError, ProtocolError) as exc:
            log.warning("storage %d: could not send %s to %d: %s", self.id, msg.type.name, peer, exc)

    def _peers(self, rows: list) -> None:
        for pid, _stage, location, address in rows:
            if pid != self.id:
                self._connect(pid, location, address)

    def _connect(self, pid: int, location: str, address: str) -> None:
        if self.known.get(pid) != address:
            self.netem.set_location(pid, location)
            self.transport.connect(pid, address)
            self.known[pid] = address

    def _versions(self) -> dict[str, list[int]]:
        return {str(s): sorted(v) for s, v in self.snapshots.items()}

    def _store(self, msg: Message) -> None:
        stage, version = msg.meta["stage"], msg.meta["checkpoint"]
        if not isinstance(stage, int) or not isinstance(version, int):
            log.warning("storage %d: dropped a checkpoint with stage %r version %r", self.id, stage, version)
            return
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
        self._send(
            SUPERVISOR_ID,
            Message(
                MessageType.CONTROL,
                self.id,
                meta={"command": "stored", "stage": stage, "version": version, "bytes": nbytes},
            ),
        )

    def _serve(self, msg: Message) -> None:
        stage, version = msg.meta["stage"], msg.meta.get("version")
        address = msg.meta.get("address")
        if isinstance(address, str) and address.startswith("tcp://"):
            self._connect(msg.sender, str(msg.meta.get("location", "")), address)
        snap = self.snapshots.get(stage, {}).get(version)
        reply = {"stage": stage, "request": msg.meta.get("request", "")}
        if snap is None:
            reply["error"] = f"no checkpoint of stage {stage} at version {version}"
            self._send(msg.sender, Message(MessageType.WEIGHTS_RESPONSE, self.id, meta=reply))
            return
        meta = {k: v for k, v in snap.meta.items() if k != "checkpoint"} | reply
        tensors: dict[str, torch.Tensor] = snap.tensors
        if not msg.meta.get("optimizer"):
            tensors = {k: v for k, v in tensors.items() if k.startswith("w.")}
        self._send(msg.sender, Message(MessageType.WEIGHTS_RESPONSE, self.id, meta=meta, tensors=tensors))
