"""Per-machine admission without processes (checkfree/swarm/wire/auth.py, checkfree/swarm/supervisor/machines.py):
each machine's share of the node ids, its token's keys, a launcher taking only its own nodes, a machine revoked,
and the command-line refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from checkfree.cli import main
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.journal import decode_results, encode_results
from checkfree.swarm.supervisor.machines import read_revocations, request_revocation
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire.auth import KEY_WINDOW, AuthError, MachineLayout, SwarmKeys, read_token
from checkfree.swarm.wire.protocol import Message, MessageType


def test_each_machine_gets_its_nodes_and_a_stripe_of_replacement_ids() -> None:
    layout = MachineLayout(10, 11, (0, 4))  # default: the other machine hosts 4..9
    assert [(m.start, m.end) for m in layout.machines] == [(0, 4), (4, 10)] and layout.own.start == 0
    other = layout.by_start(4)
    assert other is not None and other.owns(7) and not other.owns(3) and other.owns(other.launcher)
    assert other.replacement_ids(11, 3) == [12, 14, 16] and layout.own.replacement_ids(13, 2) == [13, 15]
    assert layout.machine_of(10) is layout.own and layout.machine_of(-1) is layout.own  # storage, supervisor
    assert layout.replacement_id(other, 13, revoked={14}) == 16  # never an evicted id
    assert len(layout.window(11)) == 2 * KEY_WINDOW
    layout.revoked.add(4)
    assert layout.window(11) == layout.own.replacement_ids(
        11, KEY_WINDOW
    )  # a revoked machine's stripe retires
    three = MachineLayout(10, 11, (4, 7), [(0, 4), (7, 10)])
    assert [m.offset for m in three.machines] == [0, 1, 2] and three.own.start == 4
    with pytest.raises(ValueError, match="does not split the swarm's nodes 0..9"):
        MachineLayout(10, 11, (0, 4), [(4, 8)])  # nodes 8, 9 on no machine
    with pytest.raises(ValueError, match="does not split"):
        MachineLayout(10, 11, (0, 4), [(3, 10)])  # node 3 on two machines


def test_a_machines_token_derives_the_keys_of_its_own_ids_only(tmp_path: Path) -> None:
    keys = SwarmKeys.new()
    keys.set_layout(MachineLayout(10, 11, (0, 4)))
    machine = keys.layout.by_start(4)  # type: ignore[union-attr]
    keys.write_token(tmp_path / "t.json", "tcp://a:1", machine)
    held, _ = read_token(tmp_path / "t.json")
    for ident in (4, 9, 12, machine.launcher):
        assert held.public_key(ident) == keys.public_key(ident)
    for ident in (0, 3, 10, 11, 13):  # the supervisor's machine: its nodes, the storage node, its stripe
        with pytest.raises(AuthError, match="is not one of machine 4"):
            held.secret_key(ident)
    assert held.public_key(-1) == keys.public_key(-1)
    assert SwarmKeys(keys.secret_bytes()).public_key(0) == keys.public_key(
        0
    )  # its own machine: from S itself
    assert SwarmKeys(keys.secret_bytes()).public_key(5) != keys.public_key(5)  # machine 4's: from its secret
    old = {"version": 1, "bootstrap": "tcp://a:1", "supervisor_key": keys.public_key(-1), "swarm_secret": "x"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(AuthError, match="is of version 1; expected a machine's token"):
        read_token(tmp_path / "old.json")


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    """A supervisor of configs/tiny_config.json (stages 0..4, 1 replica) hosting nodes 0-1, machine 2 hosting nodes
    2-4 through its launcher; every slot serving; no process is started."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "ours", {}, iterations=1, run_dir=tmp_path, vocab_size=300, start=0, end=2)
    for slot in sup.roster.slots:
        slot.serving, slot.address = True, f"tcp://127.0.0.1:{7000 + slot.slot}"
        sup.roster.by_node[slot.occupant] = slot
    yield sup
    sup.transport.close()


def _launcher_join(sender: int, slots: list[int]) -> Message:
    meta = {"stage": -2, "location": "", "address": "tcp://127.0.0.1:9", "slots": slots}
    return Message(MessageType.JOIN, sender, meta=meta)


def _three_machines(run_dir: Path) -> Supervisor:
    """A supervisor of tiny_config's 5 nodes (1 replica) on three machines: here 0-1, machine 2 (2-3), machine 4 (4)."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    return Supervisor(
        cfg,
        "ours",
        {},
        iterations=1,
        run_dir=run_dir,
        vocab_size=300,
        start=0,
        end=2,
        machines=[(2, 4), (4, 5)],
    )


def test_a_launcher_takes_only_its_own_machines_nodes(tmp_path: Path) -> None:
    sup = _three_machines(tmp_path)
    try:
        assert set(sup.token_paths()) == {2, 4}
        assert sup.peer_messages.handle(_launcher_join(1_000_003, [2, 3, 4])) == []  # no machine starts at 3
        actions = sup.peer_messages.handle(_launcher_join(1_000_002, [0, 1, 2, 3, 4]))
        assert [a.slot.slot for a in actions] == [2, 3]  # not the supervisor's nodes, nor machine 4's node 4
        assert [a.slot.slot for a in sup.peer_messages.handle(_launcher_join(1_000_004, [4]))] == [4]
        bad = sup.peer_messages.bad_messages
        unreachable = _launcher_join(1_000_004, [4])
        unreachable.meta["address"] = "tcp://x"  # an address libzmq refuses: one bad message, no ZMQError
        sup.roster.launchers.discard(1_000_004)
        assert sup.peer_messages.handle(unreachable) == [] and sup.peer_messages.bad_messages == bad + 1
    finally:
        sup.transport.close()


def test_a_revoked_machine_is_shut_out_and_its_slots_move_here(sup: Supervisor, tmp_path: Path) -> None:
    keys = sup.state.keys
    assert keys is not None and keys.layout is not None and set(sup.token_paths()) == {2}
    (tmp_path / "join_tokens").mkdir()
    (tmp_path / "join_tokens" / "machine2.json").write_text("{}")
    for n in (2, 3, 4):
        sup.roster.slots[n].launcher = 1_000_002
    sup.roster.launchers.add(1_000_002)
    ring = sup.transport.identity.keyring  # type: ignore[union-attr]
    t = [0.0]
    sup.revocations.clock = lambda: t[0]
    assert ring.owner(keys.public_key(3)) == 3 and sup.revocations.due() == []
    with pytest.raises(ValueError, match="machine 0 is not one of the run's machines"):
        request_revocation(tmp_path, 0)  # the supervisor's own machine has no token
    assert request_revocation(tmp_path, 2) and not request_revocation(tmp_path, 2)
    assert read_revocations(tmp_path) == [2] and sup.revocations.due() == []  # looked less than a second ago
    t[0] += 1.0
    (machine,) = sup.revocations.due()
    sup.revocations.revoke(machine, iteration=5, now=12.0)
    t[0] += 1.0
    assert sup.revocations.due() == []
    window = [n for n in keys.layout.window(sup.roster.next_id) if machine.owns(n)]
    assert window == []  # its stripe is retired
    revoked = {2, 3, 4, 1_000_002, *machine.replacement_ids(sup.cfg.first_replacement_id, KEY_WINDOW)}
    assert revoked <= sup.roster.revoked and revoked <= keys.revoked
    assert all(ring.owner(keys.public_key(n)) is None for n in (2, 3, 4, 1_000_002))  # refused from now on
    assert ring.owner(keys.public_key(1)) == 1
    slots = sup.roster.slots[2:5]
    assert (
        all(s.local and s.launcher is None and s.dead for s in slots)
        and 1_000_002 not in sup.roster.launchers
    )
    assert sup.processes.replacement_id(slots[0]) in keys.layout.own.replacement_ids(sup.roster.next_id, 1)
    (record,) = sup.results.machine_revocations
    assert record["machine"] == 2 and record["slots_moved"] == [2, 3, 4] and record["iteration"] == 5


def test_a_resumed_supervisor_keeps_a_revoked_machines_stripe_retired(tmp_path: Path) -> None:
    """The revocation request stays in the run directory: a supervisor started on it (``--resume``) admits none
    of the revoked machine's replacement ids, and revokes again only a machine its records do not show revoked."""
    (tmp_path / "join_tokens").mkdir()
    for start in (2, 4):
        (tmp_path / "join_tokens" / f"machine{start}.json").write_text("{}")
    request_revocation(tmp_path, 2)
    request_revocation(tmp_path, 4)
    sup = _three_machines(tmp_path)
    try:
        keys = sup.state.keys
        assert keys is not None and keys.layout is not None and keys.layout.revoked == {2, 4}
        ring = sup.transport.identity.keyring  # type: ignore[union-attr]
        for start in (2, 4):
            stripe = keys.layout.by_start(start).replacement_ids(sup.cfg.first_replacement_id, 3)  # type: ignore[union-attr]
            assert all(ring.owner(keys.public_key(n)) is None for n in stripe)
        journaled = Results(sup.cfg, sup.setting, 3)
        journaled.machine_revoked({"machine": 2})  # the journal's record: machine 2 was revoked
        decode_results(
            sup.results, json.loads(json.dumps(encode_results(journaled)))
        )  # as Supervisor.restore
        assert [m.start for m in sup.revocations.due()] == [4]  # machine 4 was asked while no supervisor ran
    finally:
        sup.transport.close()


@pytest.mark.parametrize(
    "argv, sentence",
    [
        (["--machines", "2:3"], "--machines 2:3 with this machine's nodes 0..1 does not split"),
        (["--machines", "2-4"], "--machines part '2-4' is not START:END"),
        (["--machines", "2:4", "--insecure"], "--machines splits the swarm into machines"),
    ],
)
def test_swarm_run_refuses_a_wrong_machine_split_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], sentence: str
) -> None:
    run = ["swarm", "run", "--setting", "ours", "--config", "swarm_tiny.json", "--no-schedule", "--end", "2"]
    code = main([*run, "--replicas", "1", *argv, "--run-dir", str(tmp_path / "run"), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and sentence in err and "Traceback" not in err and not (tmp_path / "run").exists()


def test_a_join_token_is_for_its_machines_nodes_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = SwarmKeys.new()
    keys.set_layout(MachineLayout(5, 6, (0, 2)))
    keys.write_token(tmp_path / "t.json", "tcp://127.0.0.1:9", keys.layout.by_start(2))  # type: ignore[union-attr]
    run = [
        "swarm",
        "run",
        "--setting",
        "ours",
        "--config",
        "swarm_tiny.json",
        "--no-schedule",
        "--replicas",
        "1",
    ]
    code = main(
        [*run, "--join-token", str(tmp_path / "t.json"), "--start", "3", "--run-dir", str(tmp_path / "b")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "is for machine 2 (nodes 2..4), not START 3" in err and not (tmp_path / "b").exists()


def test_swarm_revoke_names_what_it_expects(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["swarm", "revoke", str(tmp_path), "4"]) == 2
    assert "machine 4 is not one of the run's machines" in capsys.readouterr().err
    (tmp_path / "join_tokens").mkdir()
    (tmp_path / "join_tokens" / "machine4.json").write_text("{}")
    assert main(["swarm", "revoke", str(tmp_path), "4"]) == 0
    assert "revocation asked" in capsys.readouterr().out and read_revocations(tmp_path) == [4]
