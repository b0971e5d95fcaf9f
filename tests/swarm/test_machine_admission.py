"""Per-machine admission, live (checkfree/swarm/wire/auth.py, checkfree/swarm/supervisor/machines.py): a machine's
join token speaks only for that machine's nodes, and ``swarm revoke`` shuts one machine out while the run goes on.

The supervisor's machine hosts nodes 0-1; a launcher (machine 2, the "volunteer") hosts nodes 2-3 with its token.
Whoever holds machine 2's token derives from it the key it would take to speak as node 1, of the first machine:
every ZAP check refuses that key (the supervisor's and a node's), and counts it. Then machine 2 is revoked: its own
keys are refused from then on, its slots move to the supervisor's machine, and training goes on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from pathlib import Path

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from checkfree.swarm.launcher import run_launcher
from checkfree.swarm.supervisor.machines import request_revocation
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire.protocol import SUPERVISOR_ID

from helpers.swarm import live_config, node_report, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _key_from_token(token: Path, ident: int) -> bytes:
    """What a holder of ``token`` computes for identity ``ident`` (the derivation is public; the secret is the
    token's)."""
    secret = zmq.utils.z85.decode(json.loads(token.read_text())["machine_secret"].encode())
    return zmq.utils.z85.encode(
        hmac.new(secret, f"checkfree-swarm-key:{ident}".encode(), hashlib.sha256).digest()
    )


def _handshake(sup: Supervisor, target: int, secret: bytes, timeout: float = 10.0) -> str:
    """A fresh CURVE connection to ``target`` (-1: the supervisor) with the secret key ``secret``: 'ok', or
    'refused' by the target's ZAP check."""
    address = sup.address if target == SUPERVISOR_ID else sup.node_address(target)
    assert address is not None and sup.state.keys is not None
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = sup.state.keys.public_key(target).encode()
    sock.curve_secretkey = secret
    sock.curve_publickey = zmq.curve_public(secret)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        sock.connect(address)
        if not monitor.poll(timeout * 1000):
            return "no answer"
        return "ok" if recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED else "refused"
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


def test_a_machines_token_speaks_only_for_its_nodes_and_a_revoked_machine_is_shut_out(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1, microbatch_timeout=10, iteration_timeout=40)
    sup = Supervisor(
        cfg, "ours", {}, iterations=10_000, run_dir=tmp_path / "a", vocab_size=300, start=0, end=2
    )
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    token = tmp_path / "a" / "join_tokens" / "machine2.json"
    wait_until(token.exists, sup, thread, timeout=60)
    launched: list[int] = []
    launcher = threading.Thread(
        target=lambda: launched.append(
            run_launcher(None, 2, 4, tmp_path / "b", token=token, supervisor_grace=3.0)
        ),
        daemon=True,
    )
    launcher.start()
    try:
        wait_until(lambda: len(sup.results.rows) >= 2, sup, thread)
        refused_before = sup.transport.identity.keyring.refusals.refused  # type: ignore[union-attr]
        as_node_1 = _key_from_token(token, 1)  # machine 2's token, speaking as node 1 of the first machine
        assert as_node_1 != sup.state.keys.secret_key(1)  # type: ignore[union-attr]
        assert _handshake(sup, SUPERVISOR_ID, as_node_1) == "refused"
        assert _handshake(sup, 0, as_node_1) == "refused"
        assert (
            _handshake(sup, 3, _key_from_token(token, 0)) == "refused"
        )  # as node 0, to machine 2's own node
        own = _key_from_token(token, 3)  # its own node's key works where it should
        assert own == sup.state.keys.secret_key(3) and _handshake(sup, 0, own) == "ok"  # type: ignore[union-attr]
        assert sup.transport.identity.keyring.refusals.refused >= refused_before + 1  # type: ignore[union-attr]
        wait_until(lambda: node_report(sup, 0).get("refused_connections", 0) >= 1, sup, thread)

        # the volunteer's token leaked: shut machine 2 out while the run goes on
        assert request_revocation(tmp_path / "a", 2)
        wait_until(lambda: sup.results.machine_revocations, sup, thread, timeout=30)
        rows = len(sup.results.rows)
        wait_until(
            lambda: len(sup.results.rows) >= rows + 2 and sup.roster.all_serving(), sup, thread, timeout=150
        )
        moved = [sup.roster.slots[2], sup.roster.slots[3]]
        assert all(s.local and s.occupant in sup.host.procs for s in moved)  # now on the supervisor's machine
        assert all(not (2 <= s.occupant < 4) for s in moved)
        assert _handshake(sup, SUPERVISOR_ID, own) == "refused"  # its keys admit nothing any more
        wait_until(lambda: _handshake(sup, 0, own, timeout=3) == "refused", sup, thread, timeout=30)
        launcher.join(timeout=60)  # its supervisor is gone for it: it stops its nodes after its grace
        assert launched == [3]
    finally:
        sup.iterations = 0  # finish the current iteration, then shut down in order
        thread.join(timeout=90)
    assert not thread.is_alive() and result["status"] == "completed"
    (record,) = result["machine_revocations"]
    assert record["machine"] == 2 and record["slots_moved"] == [2, 3]
    assert {2, 3, 1_000_002} <= set(record["revoked_ids"])
    assert result["refused_connections"]["supervisor"] >= 2 and result["refused_connections"]["0"] >= 1
