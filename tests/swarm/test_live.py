"""Live swarms on 127.0.0.1: real node processes, a SIGKILL mid-iteration, hostile bytes at a serving node.

Tiny model (d 32, vocab 300, 3 transformer stages x 1 layer), synthetic batches, no WAN delay: the tests
exercise the processes, the protocol and the recovery, not the speed.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from pathlib import Path

import pytest
import torch
import zmq

from checkfree.recovery.math import checkfree_weight, weighted_average
from checkfree.swarm.node.compute import build_stage
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire.protocol import HEADER, MAGIC, VERSION, Message, MessageType, encode

from helpers.swarm import MODEL, live_config, state_of


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sigkill_mid_iteration_recovers_by_checkfree_and_training_continues(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=2, crash_point=0.3)
    # nodes 4 and 5 = both replicas of stage 2 (a whole-stage failure); node 3 = one replica of stage 1
    schedule = {4: [2], 5: [2], 3: [4]}
    checks: list[str] = []

    def on_recovered(sup: Supervisor, crashes: list[dict]) -> None:
        for crash in crashes:
            new = sup.fetch_weights(crash["replacement_node"], crash["stage"])
            sources = [
                sup.fetch_weights(n, s)
                for n, s in zip(crash["source_nodes"], crash["source_stages"], strict=True)
            ]
            if crash["rule"] == "checkfree":
                omegas = [checkfree_weight(float(m.meta["grad_norm"]), 1.0, "paper") for m in sources]
                assert crash["omegas"] == pytest.approx(omegas, rel=0, abs=0)
                assert all(w != 1.0 for w in omegas)  # real gradient norms of completed iterations
                want = weighted_average(state_of(sources[0]), state_of(sources[1]), *omegas)
                got = state_of(new)
                assert all(torch.equal(got[k], want[k]) for k in want), "not the CheckFree combination"
                assert new.meta["lr"] == pytest.approx(MODEL["lr"] * MODEL["lr_scale"])
                checks.append("checkfree")
            else:
                assert crash["rule"] == "replica"
                got, want = state_of(new), state_of(sources[0])
                assert all(torch.equal(got[k], want[k]) for k in want)
                checks.append("replica")

    sup = Supervisor(
        cfg,
        "ours",
        schedule,
        iterations=7,
        run_dir=tmp_path / "run",
        vocab_size=300,
        on_recovered=on_recovered,
    )
    out = sup.run()
    assert sorted(checks) == ["checkfree", "checkfree", "replica"]
    assert out["iterations_completed"] == 7 and out["crashes_count"] == 3 and out["recovered_count"] == 3
    # the whole-stage loss aborted its attempt (redone); the replica's death re-routed its attempt (issue 39)
    assert out["aborted_attempts"] == 1
    assert [r["rerouted"] for r in out["iterations"]] == [0, 0, 0, 0, 1, 0, 0]
    assert [r["iteration"] for r in out["iterations"]] == list(range(7))  # nothing lost, nothing twice
    assert {c["stage"] for c in out["crashes"]} == {1, 2} and {c["rule"] for c in out["crashes"]} == {
        "checkfree",
        "replica",
    }
    assert all(math.isfinite(loss) for _, loss in out["loss_curve"])
    assert out["bytes_sent_by_type"]["WEIGHTS_RESPONSE"] > 0 and out["bytes_sent_by_type"]["GRADIENTS"] > 0
    logs = sorted(p.name for p in (tmp_path / "run").glob("node*.log"))
    assert len(logs) == 8 + 3 and (tmp_path / "run" / "throughput.json").is_file()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ours_plus_rebuilds_a_lost_stage_0_from_the_copies_its_neighbours_hold(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1, model={"n_stages": 4}, crash_point=0.3)
    # one pipeline, node i = stage i: node 0 is the only stage-0 node; it dies during iteration 3
    checks: list[dict] = []

    def on_recovered(sup: Supervisor, crashes: list[dict]) -> None:
        for crash in crashes:
            new = sup.fetch_weights(crash["replacement_node"], 0)
            embedding = sup.fetch_weights(1, 0, part="embedding")
            head = sup.fetch_weights(4, 0, part="head")
            copies = state_of(embedding) | state_of(head)
            got = state_of(new)
            assert got.keys() == copies.keys() and all(torch.equal(got[k], copies[k]) for k in got)
            # the copies are the weights after the last committed step (iterations 0-2), not a fresh init
            assert embedding.meta["version"] == head.meta["version"] == new.meta["version"] == 3
            fresh = build_stage(sup.cfg.model, 0, 300, sup.cfg.init_seed).state_dict()
            assert all(not torch.equal(got[k], fresh[k]) for k in ("embed_tokens.weight", "lm_head.weight"))
            assert new.meta["lr"] == pytest.approx(
                MODEL["lr"] * MODEL["lr_scale"]
            )  # fresh Adam (docs/paper.md §3)
            checks.append(crash)

    sup = Supervisor(
        cfg,
        "ours-plus",
        {0: [3]},
        iterations=6,
        run_dir=tmp_path / "run",
        vocab_size=300,
        on_recovered=on_recovered,
    )
    out = sup.run()
    assert len(checks) == 1 and out["iterations_completed"] == 6 and out["recovered_count"] == 1
    crash = out["crashes"][0]
    assert (crash["stage"], crash["rule"], crash["parts"], crash["fallback"]) == (
        0,
        "stage0_copy",
        ["embedding", "head"],
        None,
    )
    assert crash["source_stages"] == [1, 4] and crash["source_nodes"] == [1, 4]
    assert out["bytes_sent_by_type"]["STAGE0_COPY"] > 0
    assert [r["iteration"] for r in out["iterations"]] == list(range(6))
    assert all(math.isfinite(loss) for _, loss in out["loss_curve"])


INSIDER = 1
"""The attacker of the hostile-bytes test holds node 1's key (it passes CURVE) and sends as node 1."""


def _hostile() -> dict[str, list[bytes]]:
    good = [
        bytes(f)
        for f in encode(
            Message(MessageType.FORWARD, INSIDER, 0, 0, {"stage": 0}, {"activations": torch.zeros(1, 16, 32)})
        )
    ]
    schema = [
        Message(MessageType.FORWARD, INSIDER, 0, 0, {"stage": 0}, {"activations": torch.zeros(1, 16, 32)}),
        Message(MessageType.GRADIENTS, INSIDER, 0, -1, {"stage": 1, "attempt": "x"}, {"g.x": torch.zeros(2)}),
        Message(MessageType.CONTROL, INSIDER, meta={"command": "crash"}),
    ]
    return {
        "pickle payload": [pickle.dumps({"evil": 1})],
        "truncated frame": [good[0][:17]] + good[1:],
        "length 2**63": good[:2] + [good[2][:-8] + (2**63).to_bytes(8, "little")] + good[3:],
        "wrong dtype": good[:2] + [bytes([200]) + good[2][1:]] + good[3:],
        "wrong shape": good[:2]
        + [good[2][:-16] + (5).to_bytes(8, "little", signed=True) + good[2][-8:]]
        + good[3:],
        "unknown type": [HEADER.pack(MAGIC, VERSION, 77, 0, INSIDER, 1, 0, len(good[1]), 1)] + good[1:],
        "no attempt": [bytes(f) for f in encode(schema[0])],
        "attempt not an integer": [bytes(f) for f in encode(schema[1])],
        "unknown command": [bytes(f) for f in encode(schema[2])],
    }


def _nonsense() -> list[list[bytes]]:
    """Well-formed on the wire and in their schema, nonsense to a node: caught by the node, not the
    transport."""
    msgs = [
        Message(MessageType.CONTROL, INSIDER, meta={"command": "shutdown"}),  # only the supervisor commands
        Message(MessageType.GRADIENTS, INSIDER, 0, -1, {"stage": 1, "attempt": 0, "microbatches": 1}, {}),
        # a stage-0 copy under a setting that keeps none, from a node that does not serve stage 0
        Message(
            MessageType.STAGE0_COPY,
            INSIDER,
            0,
            -1,
            {"stage": 0, "part": "embedding", "version": 1},
            {"w.embed_tokens.weight": torch.zeros(300, 32)},
        ),
    ]
    return [[bytes(f) for f in encode(m)] for m in msgs]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_live_node_shrugs_off_hostile_bytes_and_keeps_serving(tmp_path: Path) -> None:
    cfg = live_config(tmp_path, replicas=1, time_scale=0.2)
    sup = Supervisor(cfg, "ours", {}, iterations=12, run_dir=tmp_path / "run", vocab_size=300)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    target = 2  # the stage-2 node, in the middle of every microbatch's route
    deadline = time.monotonic() + 120
    while sup.node_address(target) is None or not sup.results.rows:
        assert time.monotonic() < deadline and thread.is_alive(), "the swarm did not start"
        time.sleep(0.05)
    keys = sup.state.keys  # the supervisor's: every identity's key
    assert keys is not None
    raw = zmq.Context.instance().socket(zmq.PUSH)
    raw.setsockopt(zmq.LINGER, 0)
    raw.curve_serverkey = keys.public_key(target).encode()
    raw.curve_secretkey = keys.secret_key(INSIDER)
    raw.curve_publickey = keys.public_key(INSIDER).encode()
    raw.connect(sup.node_address(target))
    try:
        sent_at = len(sup.results.rows)
        for frames in [*_hostile().values(), *_nonsense()]:
            raw.send_multipart(frames)
        thread.join(timeout=150)
    finally:
        raw.close(0)
    assert not thread.is_alive() and result, "the run did not finish"
    assert sent_at < 12 and result["iterations_completed"] == 12
    final = sup.results.reports[target]
    assert final["dropped_malformed"] == len(_hostile())
    assert final["bad_messages"] == len(_nonsense())
    assert all(math.isfinite(loss) for _, loss in result["loss_curve"])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("insecure", [False, True], ids=["join-token", "insecure"])
def test_two_machines_share_a_swarm_through_the_bootstrap_address(tmp_path: Path, insecure: bool) -> None:
    from checkfree.swarm.launcher import run_launcher

    cfg = live_config(tmp_path, replicas=1)
    # this "machine" hosts nodes 0-1; the launcher (the other "machine") hosts 2-3, and node 2 crashes there
    sup = Supervisor(
        cfg,
        "ours",
        {2: [2]},
        iterations=5,
        run_dir=tmp_path / "a",
        vocab_size=300,
        start=0,
        end=2,
        insecure=insecure,
    )
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(sup.run()), daemon=True)
    thread.start()
    token = tmp_path / "a" / "join_tokens" / "machine2.json"  # the second machine's own token
    if insecure:  # plain TCP: the bootstrap address is all the second machine needs
        assert run_launcher(sup.address, 2, 4, tmp_path / "b") == 0
        assert not token.parent.exists() and not (tmp_path / "b" / "keys").exists()
    else:
        assert sup.token_paths() == {2: token}
        deadline = time.monotonic() + 60
        while not token.exists():  # the first machine writes the join token; the second reads it
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.05)
        assert run_launcher(None, 2, 4, tmp_path / "b", token=token) == 0
    thread.join(timeout=60)
    assert result["iterations_completed"] == 5 and result["recovered_count"] == 1
    assert result["crashes"][0]["rule"] == "checkfree" and result["crashes"][0]["source_nodes"] == [1, 3]
    # node 2's replacement: the second machine's first replacement id (ids 5, 7, … are the first machine's; plain
    # TCP has no machines' shares: the next id)
    replacement = 5 if insecure else 6
    assert sorted(p.name for p in (tmp_path / "b").glob("node*.log")) == [
        "node2.log",
        "node3.log",
        f"node{replacement}.log",
    ]
