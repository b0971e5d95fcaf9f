"""A swarm spanning several machines: the launcher that hosts one machine's share of the nodes.

Machine A runs the supervisor (``run_throughput.sh 0 K ...`` with ``--bind-host 0.0.0.0 --advertise-host A
--port P``); its address ``tcp://A:P`` is the *bootstrap*. Machine B runs ``run_throughput.sh K N ...
--bootstrap tcp://A:P --bind-host 0.0.0.0 --advertise-host B``, which starts this launcher instead of a
supervisor. The launcher introduces itself to the supervisor (JOIN, stage -2, with its slot range) and then
only obeys: ``spawn`` (start a node process here, pointed at the bootstrap), ``kill`` (SIGKILL one of its
own nodes by pid: a scheduled crash) and ``shutdown``; it reports ``exited`` when one of its nodes dies by
itself. All policy (schedule, recovery, results) stays with the supervisor, which writes throughput.json
on machine A; node logs stay on the machine that ran the node. When the supervisor falls silent for
``peer_timeout`` seconds the launcher kills its nodes and exits.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.transport import Transport, TransportError

log = logging.getLogger(__name__)

LAUNCHER_ID_BASE = 1_000_000
"""Launcher ids are LAUNCHER_ID_BASE + START (they never collide with node ids)."""
LAUNCHER_STAGE = -2
"""The JOIN ``stage`` that marks a launcher."""


def run_launcher(
    bootstrap: str,
    start: int,
    end: int,
    run_dir: Path,
    bind_host: str = "127.0.0.1",
    advertise_host: str | None = None,
    cache_dir: Path | None = None,
    join_timeout: float = 120.0,
) -> int:
    """Host nodes START..END−1 (and their replacements) for the supervisor at ``bootstrap``; exit code."""
    me = LAUNCHER_ID_BASE + start
    transport = Transport(me, bind_host=bind_host)
    address = transport.address
    if advertise_host:
        address = f"tcp://{advertise_host}:{address.rsplit(':', 1)[1]}"
    host = LocalHost(Path(run_dir), bootstrap, bind_host, advertise_host, cache_dir)
    reported: set[int] = set()

    def send(meta: dict) -> None:
        try:
            transport.send(SUPERVISOR_ID, Message(MessageType.CONTROL, me, meta=meta))
        except (TransportError, ProtocolError) as exc:
            log.warning("launcher %d: could not reach the supervisor: %s", me, exc)

    try:
        transport.connect(SUPERVISOR_ID, bootstrap)
        transport.send(
            SUPERVISOR_ID,
            Message(
                MessageType.JOIN,
                me,
                meta={
                    "stage": LAUNCHER_STAGE,
                    "location": "",
                    "address": address,
                    "slots": list(range(start, end)),
                },
            ),
        )
        deadline = time.monotonic() + join_timeout
        heard = False
        while True:
            msg = transport.recv(0.1)
            if msg is not None and msg.sender == SUPERVISOR_ID and msg.type == MessageType.CONTROL:
                heard = True
                command = msg.meta["command"]
                if command == "spawn":
                    m = msg.meta
                    host.spawn(int(m["node"]), int(m["stage"]), str(m["location"]), bool(m["replacement"]))
                elif command == "kill":
                    host.kill(int(msg.meta["node"]))
                    reported.add(int(msg.meta["node"]))
                elif command == "shutdown":
                    host.wait_all(timeout=15.0)
                    return 0
            for node, proc in host.procs.items():
                code = proc.poll()
                if code is not None and node not in reported:
                    reported.add(node)
                    send({"command": "exited", "node": node, "code": code})
            if not heard and time.monotonic() > deadline:
                log.error(
                    "launcher %d: no word from the supervisor at %s in %.0f s", me, bootstrap, join_timeout
                )
                return 3
            if heard and SUPERVISOR_ID in transport.dead_peers():
                log.error("launcher %d: the supervisor is gone; stopping its nodes", me)
                return 3
    finally:
        host.reap_all()
        transport.close()
