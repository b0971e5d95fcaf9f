"""A swarm spanning several machines: the launcher that hosts one machine's share of the nodes.

Machine A runs the supervisor (``run_throughput.sh 0 K ...`` with ``--bind-host 0.0.0.0 --advertise-host A
--port P``); its address ``tcp://A:P`` is the *bootstrap*, and it writes one join token per other machine,
``<run_dir>/join_tokens/machine<K>.json`` for the machine that hosts nodes K..N−1 (``--machines``;
checkfree.swarm.wire.auth: the token holds that machine's own secret, from which only its nodes' keys derive).
Machine B gets a copy of its file (scp) and runs ``run_throughput.sh K N ... --join-token FILE --bind-host 0.0.0.0
--advertise-host B``, which starts this launcher instead of a supervisor. The launcher introduces itself to the supervisor (JOIN, stage -2, with its slot range) and then
only obeys: ``spawn`` (start a node process here, pointed at the bootstrap), ``kill`` (SIGKILL one of its
own nodes by pid: a scheduled crash) and ``shutdown``; it reports ``exited`` when one of its nodes dies by
itself. All policy (schedule, recovery, results) stays with the supervisor, which writes throughput.json
on machine A; node logs stay on the machine that ran the node. When the supervisor falls silent for
``peer_timeout`` seconds, the launcher waits ``supervisor_grace`` seconds for a resumed one (``swarm run --resume``
on machine A, which dials the launcher again; checkfree.swarm.node.supervisor_watch), then kills its nodes and
exits; so it does at once on Ctrl-C or SIGTERM (checkfree.cli
turns SIGTERM into a KeyboardInterrupt, and :func:`run_launcher` reaps its nodes by pid whatever ends it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from checkfree.swarm.devices import DeviceMap
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.node.supervisor_watch import SupervisorWatch
from checkfree.swarm.wire import control
from checkfree.swarm.wire.auth import LAUNCHER_ID_BASE, read_token
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError
from checkfree.swarm.wire.transport import Transport

log = logging.getLogger(__name__)

__all__ = ["LAUNCHER_ID_BASE", "LAUNCHER_STAGE", "run_launcher"]
LAUNCHER_STAGE = -2
"""The JOIN ``stage`` that marks a launcher."""


def run_launcher(
    bootstrap: str | None,
    start: int,
    end: int,
    run_dir: Path,
    bind_host: str = "127.0.0.1",
    advertise_host: str | None = None,
    cache_dir: Path | None = None,
    join_timeout: float = 120.0,
    token: Path | None = None,
    devices: DeviceMap | None = None,
    supervisor_grace: float = 120.0,
) -> int:
    """Host nodes START..END−1 (and their replacements) for the supervisor at ``bootstrap``; exit code.

    ``token``: this machine's join token (checkfree.swarm.wire.auth); its bootstrap address is used unless
    ``bootstrap`` is given, and START..END−1 must be its machine's nodes (the caller checks it: checkfree.swarm.cli).
    The launcher starts only the ids the token's machine owns. Without a token the launcher and its nodes run
    unauthenticated
    (``--insecure`` on the supervisor's side too). ``devices``: where this machine's nodes compute
    (checkfree.swarm.devices; resolved on this machine, k = node id − START); None: the nodes' default, the CPU.
    ``supervisor_grace``: seconds to wait for a resumed supervisor once the supervisor fell silent.

    Raises:
        AuthError: the token cannot be read.
        ValueError: neither a token nor a bootstrap address is given, or the token is another machine's.
    """
    me = LAUNCHER_ID_BASE + start
    keys, identity = None, None
    if token is not None:
        keys, token_bootstrap = read_token(token)
        if (start, end) != (keys.machine.start, keys.machine.end):
            raise ValueError(
                f"the join token {token} is for {keys.machine.describe()}, not nodes {start}..{end - 1}; expected "
                f"START {keys.machine.start} END {keys.machine.end} (or none: the token's)."
            )
        bootstrap = bootstrap or token_bootstrap
        identity = keys.identity(me)
    if bootstrap is None:
        raise ValueError("a launcher needs --join-token FILE (or --bootstrap ADDRESS with --insecure).")
    transport = Transport(me, bind_host=bind_host, identity=identity, validate=control.check)
    address = transport.address
    if advertise_host:
        address = f"tcp://{advertise_host}:{address.rsplit(':', 1)[1]}"
    host = LocalHost(
        Path(run_dir), bootstrap, bind_host, advertise_host, cache_dir, keys=keys, devices=devices
    )
    if devices is not None:
        log.info("launcher %d: nodes %d..%d compute on %s", me, start, end - 1, devices.describe())
    reported: set[int] = set()
    state = {"heard": False, "done": False}
    watch = SupervisorWatch(f"launcher {me}", supervisor_grace)

    def send(meta: dict) -> None:
        try:
            transport.send(SUPERVISOR_ID, Message(MessageType.CONTROL, me, meta=meta))
        except TransportError as exc:
            log.warning("launcher %d: could not reach the supervisor: %s", me, exc)

    def spawn(m: dict) -> None:
        if m["node"] in host.procs:
            raise ProtocolError(f"spawn of node {m['node']}, which this launcher started already")
        if keys is not None and not keys.machine.owns(m["node"]):
            raise ProtocolError(
                f"spawn of node {m['node']}, which is not one of {keys.machine.describe()}'s ids"
            )
        admitted = {int(k): v for k, v in m["keys"].items()}
        host.spawn(m["node"], m["stage"], m["location"], m["replacement"], admitted)

    def kill(m: dict) -> None:
        if m["node"] not in host.procs:
            raise ProtocolError(f"kill of node {m['node']}, which this launcher did not start")
        host.kill(m["node"])
        reported.add(m["node"])

    def shutdown(m: dict) -> None:
        host.wait_all(timeout=15.0)
        state["done"] = True

    commands: dict[str, Callable[[dict], None]] = {"spawn": spawn, "kill": kill, "shutdown": shutdown}

    try:
        transport.connect(SUPERVISOR_ID, bootstrap)
        join = {"stage": LAUNCHER_STAGE, "location": "", "address": address, "slots": list(range(start, end))}
        transport.send(SUPERVISOR_ID, Message(MessageType.JOIN, me, meta=join))
        deadline = time.monotonic() + join_timeout
        while not state["done"]:
            msg = transport.recv(0.1)
            if msg is not None:
                try:
                    handler = commands.get(msg.meta.get("command", ""))
                    if msg.sender != SUPERVISOR_ID or msg.type != MessageType.CONTROL or handler is None:
                        raise ProtocolError(
                            "only the supervisor's spawn, kill and shutdown are for a launcher"
                        )
                    state["heard"] = True
                    handler(msg.meta)
                except ProtocolError as exc:
                    log.warning("launcher %d: dropped a %s from %d: %s", me, msg.type.name, msg.sender, exc)
            for node, proc in host.procs.items():
                code = proc.poll()
                if code is not None and node not in reported:
                    reported.add(node)
                    send(control.control("exited", node=node, code=code))
            if not state["heard"] and time.monotonic() > deadline:
                log.error(
                    "launcher %d: no word from the supervisor at %s in %.0f s", me, bootstrap, join_timeout
                )
                return 3
            if state["heard"]:
                silent = SUPERVISOR_ID in transport.dead_peers()
                if watch.away and not silent:
                    watch.back()  # a resumed supervisor dialled this launcher again
                if watch.check(silent) == "expired":
                    log.error("launcher %d: the supervisor is gone; stopping its nodes", me)
                    return 3
        return 0
    finally:
        host.reap_all()
        transport.close()
