"""Attacks on a live swarm (issue 10): forged, spoofed, implausible and flooding messages, a peer without the
swarm's key, a storage-node restart. One small ``checkpoint`` swarm (4 nodes + storage) serves every attack;
each test attacks, lets the swarm commit more iterations and checks the counters the nodes report.

The attacker is an *insider* that holds the join token (so it can derive a node's key and pass the CURVE
handshake) or an outsider without it; every message is built with the real wire format so that it passes
the transport and reaches the application's checks.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterator

import pytest
import torch
import zmq

from checkfree.swarm.launcher import LAUNCHER_ID_BASE
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType

from helpers.swarm import Attacker, after_commits, live_config, node_report, wait_until

NODES = 4  # one pipeline: node i = stage i (3 transformer stages), storage node id 4


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    tmp = tmp_path_factory.mktemp("attacked")
    cfg = live_config(tmp, replicas=1, time_scale=0.1, checkpoint_every=2, recovery_timeout=60)
    sup = Supervisor(cfg, "checkpoint", {}, iterations=10_000, run_dir=tmp / "run", vocab_size=300)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    wait_until(lambda: len(sup.results.rows) >= 2, sup, thread)
    sup.thread = thread  # type: ignore[attr-defined]
    yield sup
    sup.iterations = 0  # finish the current iteration, then shut down in order
    thread.join(timeout=60)
    assert not thread.is_alive() and result, "the attacked swarm did not finish"
    assert all(math.isfinite(loss) for _, loss in result["loss_curve"])
    assert 10**6 not in {v for versions in sup.state.checkpoints.stored.values() for v in versions}
    # the attacked swarm still shuts down in order: every node alive at the end (the storage node included)
    # answers the shutdown with its final statistics (Supervisor._shutdown keeps them in results.finals)
    alive = {slot.occupant for slot in sup.roster.all() if not slot.dead}
    finals = sup.results.finals
    missing = alive - set(finals)
    assert len(alive) == NODES + 1 and not missing, f"no final statistics from nodes {sorted(missing)}"
    # and throughput.json holds them: each live node's counters as of its final report, and the bytes sent
    saved = json.loads((tmp / "run" / "throughput.json").read_text())
    for n in alive:
        assert saved["malformed_dropped"][str(n)] == finals[n]["dropped_malformed"], n
        assert saved["rejected_messages"].get(str(n)) == finals[n].get("rejected"), n
    for kind in ("CONTROL", "FORWARD", "BACKWARD"):
        sent = sum(f["sent_bytes"].get(kind, 0) for f in finals.values())
        assert saved["bytes_sent_by_type"][kind] >= sent > 0, kind


def _counts(sup: Supervisor, node: int) -> tuple[int, int, int]:
    r = node_report(sup, node)
    return r.get("bad_messages", 0), r.get("dropped_malformed", 0), r.get("dropped_spoofed", 0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_peer_without_the_swarm_key_cannot_reach_the_application(swarm: Supervisor) -> None:
    before = _counts(swarm, 3)
    forged = Message(MessageType.CONTROL, SUPERVISOR_ID, meta={"command": "shutdown"})
    garbage = Message(MessageType.CONTROL, SUPERVISOR_ID, meta={"command": "stored"})
    for key in ("none", "random"):  # plain TCP, and CURVE with a key the swarm never admitted
        attacker = Attacker(swarm, 3, None, key=key)
        attacker.sock.setsockopt(zmq.SNDTIMEO, 500)
        try:
            for _ in range(5):
                try:
                    attacker.send(forged, garbage)
                except zmq.Again:
                    pass  # the handshake never completes: nothing can even be queued
        finally:
            attacker.close()
    after_commits(swarm)
    assert _counts(swarm, 3) == before  # not one byte reached node 3's application: nothing to count
    assert 3 in swarm.roster.members()[3]  # the forged shutdown did nothing


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_spoofed_sender_is_dropped_and_counted(swarm: Supervisor) -> None:
    bad, malformed, spoofed = _counts(swarm, 2)
    attacker = Attacker(swarm, 2, as_id=1)  # holds node 1's key, claims to be the supervisor / node 3
    try:
        attacker.send(
            Message(MessageType.CONTROL, SUPERVISOR_ID, meta={"command": "shutdown"}),
            Message(
                MessageType.CONTROL, SUPERVISOR_ID, meta={"command": "abort", "attempt": swarm.state.attempt}
            ),
            Message(MessageType.LEAVE, 3),
        )
    finally:
        attacker.close()
    after_commits(swarm)
    assert _counts(swarm, 2)[2] == spoofed + 3
    assert 2 in swarm.roster.members()[2]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_forged_commands_from_a_node_do_not_stop_or_stall_another(swarm: Supervisor) -> None:
    bad = _counts(swarm, 2)[0]
    attacker = Attacker(swarm, 2, as_id=1)  # a compromised node 1 commands node 2
    attempt = swarm.state.attempt
    try:
        attacker.send(
            Message(MessageType.CONTROL, 1, meta={"command": "shutdown"}),
            Message(MessageType.CONTROL, 1, meta={"command": "commit", "attempt": attempt, "iteration": 0}),
            Message(
                MessageType.CONTROL, 1, meta={"command": "begin", "attempt": 0, "iteration": 0, "members": {}}
            ),
        )
    finally:
        attacker.close()
    after_commits(swarm)
    assert _counts(swarm, 2)[0] == bad + 3
    assert swarm.results.aborts == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_malformed_and_lying_messages_to_the_supervisor_are_dropped(swarm: Supervisor) -> None:
    malformed, bad = swarm.transport.stats["dropped_malformed"], swarm.peer_messages.bad_messages
    refused = swarm.transport.identity.keyring.refusals.refused  # type: ignore[union-attr]
    address = swarm.node_address(1)
    lies = Attacker(swarm, SUPERVISOR_ID, as_id=1)
    launcher = Attacker(swarm, SUPERVISOR_ID, as_id=LAUNCHER_ID_BASE)
    try:
        lies.send(
            Message(MessageType.CONTROL, 1, meta={"command": "stored"}),  # KeyError 'stage' before
            Message(
                MessageType.CONTROL, 1, meta={"command": "stored", "stage": 1, "version": 10**6, "bytes": 1}
            ),
            Message(
                MessageType.JOIN, 1, meta={"stage": 1, "location": "Iowa", "address": "tcp://127.0.0.1:9"}
            ),
        )
        # a launcher of a swarm without other machines: no launcher key is admitted, its handshake is refused
        # (a launcher JOIN with an address libzmq refuses: tests/swarm/test_machines.py)
        launcher.send(
            Message(
                MessageType.JOIN, LAUNCHER_ID_BASE, meta={"stage": -2, "location": "", "address": "tcp://x"}
            )
        )
    finally:
        lies.close()
        launcher.close()
    after_commits(swarm)
    assert swarm.transport.stats["dropped_malformed"] == malformed + 1
    assert swarm.peer_messages.bad_messages == bad + 2
    assert swarm.transport.identity.keyring.refusals.refused > refused  # type: ignore[union-attr]
    assert swarm.node_address(1) == address  # the slot was not re-pointed to the attacker
    assert all(10**6 not in v for v in swarm.state.checkpoints.stored.values())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_poisoned_numbers_and_implausible_attempts_are_rejected(swarm: Supervisor) -> None:
    bad = _counts(swarm, 2)[0]
    nan = torch.full((2, 16, 32), float("nan"))
    attacker = Attacker(swarm, 2, as_id=1)
    far = 2**62
    msgs = [
        # NaN weights as an answer to a request nobody made (request ids are unguessable)
        Message(
            MessageType.WEIGHTS_RESPONSE,
            1,
            meta={"stage": 2, "request": "11:0:0", "version": 1},
            tensors={"w.x": torch.full((4,), float("inf"))},
        ),
        # gradients from a node that is no replica of stage 2, NaN, for a far future attempt
        Message(
            MessageType.GRADIENTS,
            1,
            0,
            -1,
            {"stage": 2, "attempt": far, "microbatches": 1},
            {"g.x": torch.full((3,), float("nan"))},
        ),
        # activations for attempt 2**62: never buffered (they used to stay in memory for the whole run)
        Message(
            MessageType.FORWARD,
            1,
            0,
            0,
            {"stage": 1, "attempt": far, "route": [0, 1, 2, 3], "pos": 2, "pipeline": 0},
            {"activations": nan},
        ),
        # a stage-0 copy from a node that does not serve stage 0, version 2**62, under a setting with none
        Message(
            MessageType.STAGE0_COPY,
            1,
            0,
            -1,
            {"stage": 0, "part": "embedding", "version": far},
            {"w.embed_tokens.weight": torch.zeros(300, 32)},
        ),
    ]
    try:
        attacker.send(*msgs)
    finally:
        attacker.close()
    after_commits(swarm)
    assert _counts(swarm, 2)[0] == bad + len(msgs)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_forged_checkpoints_never_reach_a_rollback(swarm: Supervisor) -> None:
    storage = swarm.cfg.storage_id
    bad = node_report(swarm, storage).get("bad_messages", 0)  # the storage node's count rides on its acks
    attacker = Attacker(swarm, storage, as_id=1)
    weights = {"w.x": torch.full((4,), float("nan"))}
    try:
        attacker.send(
            # stage 1 is node 1's: version far ahead of the swarm
            Message(
                MessageType.CHECKPOINT,
                1,
                meta={"stage": 1, "version": 10**6, "grad_norm": 1.0, "lr": 1e-3, "step": 1},
                tensors={"w.x": torch.ones(4)},
            ),
            # NaN weights at a plausible version
            Message(
                MessageType.CHECKPOINT,
                1,
                meta={"stage": 1, "version": 2, "grad_norm": 1.0, "lr": 1e-3, "step": 1},
                tensors=weights,
            ),
            # node 1 does not hold stage 3
            Message(
                MessageType.CHECKPOINT,
                1,
                meta={"stage": 3, "version": 2, "grad_norm": 1.0, "lr": 1e-3, "step": 1},
                tensors={"w.x": torch.ones(4)},
            ),
        )
    finally:
        attacker.close()
    after_commits(swarm, 3)
    assert all(10**6 not in v for v in swarm.state.checkpoints.stored.values())
    assert node_report(swarm, storage)["bad_messages"] == bad + 3


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_flood_of_weight_requests_opens_no_sockets_and_leaks_no_weights(swarm: Supervisor) -> None:
    target = 2
    pid = swarm.host.procs[target].pid
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    stranger = swarm.roster.next_id + 5  # admitted ahead (a future replacement), but no member of the swarm
    attacker = Attacker(swarm, target, as_id=stranger)
    sent = node_report(swarm, target).get("sent_messages", {}).get("WEIGHTS_RESPONSE", 0)
    try:
        for i in range(1100):
            attacker.send(
                Message(
                    MessageType.WEIGHTS_REQUEST,
                    stranger,
                    meta={"stage": 2, "request": f"r{i}", "optimizer": True},
                )
            )
        # the old request carried an address the node would dial: now an unknown field, malformed
        attacker.send(
            Message(
                MessageType.WEIGHTS_REQUEST, stranger, meta={"stage": 2, "request": "x", "address": "tcp://x"}
            )
        )
    finally:
        attacker.close()
    after_commits(swarm)
    assert len(os.listdir(f"/proc/{pid}/fd")) <= fds + 4  # it used to open a socket per requester id
    assert node_report(swarm, target)["sent_messages"]["WEIGHTS_RESPONSE"] == sent  # nothing answered


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_storage_restart_is_forgotten_and_refilled(swarm: Supervisor) -> None:
    storage = swarm.cfg.storage_id
    swarm.host.kill(storage)
    wait_until(lambda: swarm.state.checkpoints.lost_at is not None, swarm)
    # the respawned storage node is empty; the supervisor asks every stage for a fresh checkpoint
    wait_until(
        lambda: swarm.state.checkpoints.has_complete() and swarm.roster.storage.serving, swarm, timeout=120
    )
    after_commits(swarm)
