"""The swarm's checks without processes: control-plane schemas, recovery that moves on at once, rejected
numbers, a bug that is a crash, the supervisor forgetting a dead storage node, keys and the join token."""

from __future__ import annotations

import json
import logging
import re
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import zmq

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.node import Node
from checkfree.swarm.node.supervisor_watch import SupervisorWatch
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.state import Attempt, Reports
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError
from checkfree.swarm.wire import control
from checkfree.swarm.wire.auth import (
    REFUSAL_KEYS_NAMED,
    AuthError,
    KeyRing,
    MachineLayout,
    RefusalLog,
    SwarmKeys,
    read_key_file,
    read_token,
)
from checkfree.swarm.wire.links import TransportError
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError
from checkfree.swarm.wire.staging import HostStaging

from helpers.swarm import FakeNode, weights_answer


def _ctl(**meta) -> Message:
    return Message(MessageType.CONTROL, -1, meta=meta)


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"command": "crash"}, "CONTROL command is 'crash'"),
        ({"command": "stored"}, "lacks field 'stage'"),
        ({"command": "sync", "attempt": 1, "evil": 1}, "unknown field 'evil'"),
        ({"command": "sync", "attempt": "1"}, "field 'attempt' is '1'"),
        ({"command": "sync", "attempt": True}, "field 'attempt'"),
        ({"command": "ready", "attempt": 1, "grad_norm": 1.0, "pipelines": float("nan")}, "'pipelines'"),
        ({"command": "peers", "peers": [[1, 1, "Iowa", "udp://x"]]}, "'peers'"),
        ({"command": "rollback", "version": 2**63 - 1}, "'version'"),
    ],
)
def test_each_command_has_a_schema_checked_on_receipt(meta: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        control.check(_ctl(**meta))


def test_data_plane_schemas_and_a_senders_own_bad_command_is_a_bug() -> None:
    ok = Message(
        MessageType.FORWARD, 1, meta={"stage": 1, "attempt": 3, "route": [0, 1], "pos": 1, "pipeline": 0}
    )
    control.check(ok)
    with pytest.raises(ProtocolError, match="unknown field 'address'"):
        control.check(
            Message(MessageType.WEIGHTS_REQUEST, 1, meta={"stage": 1, "request": "r", "address": "x"})
        )
    with pytest.raises(ProtocolError, match="'grad_norm'"):  # no peer's number makes ω NaN (issue 21)
        control.check(_ctl(command="ready", attempt=1, grad_norm=float("nan"), pipelines=1.0))
    with pytest.raises(control.SchemaBug):  # not a ProtocolError: no dispatcher may swallow it
        control.control("stored", stage=1)


def test_a_rejected_answer_asks_the_next_source_at_once() -> None:
    node = FakeNode()
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    ((target, meta),) = node.sent
    assert target == 3 and len(meta["request"]) == 32  # secrets.token_hex(16): unguessable
    with pytest.raises(ProtocolError, match="unrequested"):
        rec.on_response(weights_answer(node, 3, "20:0:0"))  # the old predictable id
    nan = {f"w.{k}": torch.full_like(v, float("nan")) for k, v in node.module.state_dict().items()}
    bad = {
        "NaN": {"tensors": nan},
        "another stage": {"meta": {"stage": 3}},
        "version ahead": {"meta": {"version": 2**62}},
    }
    for i, (why, change) in enumerate(bad.items()):
        target, meta = node.sent[-1]
        if i == 2:  # the last candidate round: one more rejection would give up (max_attempts 2 x 2 sources)
            break
        rec.on_response(weights_answer(node, target, meta["request"], **change))
        assert len(node.rejected) == i + 1, why
        assert (
            node.sent[-1][0] == (5 if target == 3 else 3) and node.sent[-1][1]["request"] != meta["request"]
        )
    # a source that leaves the swarm mid-fetch: the next one is asked at once, no timeout
    target, meta = node.sent[-1]
    node.membership.peers.pop(target)
    rec.peers_changed()
    assert node.sent[-1][0] != target and len(node.sent) == 4
    assert rec.requests[0]["response"] is None and not node.gave_up


def test_gradients_with_nan_or_from_a_non_replica_are_rejected() -> None:
    node = FakeNode()
    node.membership.members = {1: [20, 5]}
    sync = node.gradient_sync()
    grads = {f"g.{n}": torch.ones_like(p) for n, p in node.module.named_parameters()}
    meta = {"stage": 1, "attempt": 4, "microbatches": 4}
    with pytest.raises(ProtocolError, match="NaN"):
        sync.on_gradients(
            Message(
                MessageType.GRADIENTS,
                5,
                3,
                -1,
                meta,
                {k: torch.full_like(v, float("nan")) for k, v in grads.items()},
            )
        )
    with pytest.raises(ProtocolError, match="not a replica"):
        sync.on_gradients(Message(MessageType.GRADIENTS, 7, 3, -1, meta, grads))
    with pytest.raises(ProtocolError, match="implausible"):
        sync.on_gradients(Message(MessageType.GRADIENTS, 5, 3, -1, meta | {"microbatches": 10**6}, grads))
    sync.on_gradients(Message(MessageType.GRADIENTS, 5, 3, -1, meta, grads))
    assert set(sync.received) == {
        (5, 1)
    }  # (sender, pipeline): slot 1 of a stage listed alone carries pipeline 1


def test_the_early_message_buffer_is_bounded_in_count_and_bytes() -> None:
    buf = FutureBuffer(max_messages=3, max_bytes=100)
    small = Message(MessageType.FORWARD, 1, meta={"attempt": 5}, tensors={"a": torch.zeros(5)})  # 20 bytes
    for _ in range(3):
        buf.add(small)
    with pytest.raises(ProtocolError, match="full"):
        buf.add(small)
    buf.take(lambda m: True)
    with pytest.raises(ProtocolError, match="full"):
        buf.add(Message(MessageType.FORWARD, 1, meta={"attempt": 5}, tensors={"a": torch.zeros(26)}))


def test_a_bug_in_a_handler_is_a_crash_not_a_bad_message() -> None:
    node = Node.__new__(Node)
    node.id, node.bad_messages, node.rejected_from = 1, 0, {}
    node.staging = HostStaging(torch.device("cpu"))
    node.watch = SupervisorWatch("node 1", grace=60.0)  # its supervisor is there
    node.handlers = {MessageType.LEAVE: lambda m: (_ for _ in ()).throw(ProtocolError("nonsense"))}
    node.dispatch(Message(MessageType.LEAVE, 2))
    assert node.bad_messages == 1
    node.handlers = {MessageType.LEAVE: lambda m: {}["missing"]}
    with pytest.raises(KeyError):
        node.dispatch(Message(MessageType.LEAVE, 2))
    assert node.bad_messages == 1


def test_a_dead_storage_node_is_forgotten_and_a_later_stage_loss_names_the_cause(tmp_path: Path) -> None:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "checkpoint", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    try:
        for slot in sup.roster.all():
            slot.serving = True
        sup.state.checkpoints.stored = {s: {0, 4} for s in range(cfg.n_stages + 1)}
        sup.state.current = Attempt(7, 6, sup.roster.members(), t_begin=0.0)
        sup.processes.mark_dead(sup.roster.storage, "process exited with code -9")
        assert sup.state.checkpoints.stored == {} and sup.state.checkpoints.lost_at == 6
        sup.roster.slots[2].serving = False  # stage 2's only replica is lost
        with pytest.raises(SwarmError, match="storage node restarted during iteration 6"):
            sup.drive(Recovering(7))
    finally:
        sup.transport.close()


def test_keys_token_and_key_files(tmp_path: Path) -> None:
    keys = SwarmKeys.new()
    assert keys.public_key(3) != keys.public_key(4) and zmq.curve_public(
        keys.secret_key(3)
    ).decode() == keys.public_key(3)
    keys.set_layout(MachineLayout(12, 13, (0, 6)))  # machine 6 hosts nodes 6..11 and replacements 14, 16, ...
    machine = keys.layout.by_start(6)
    keys.write_token(tmp_path / "token.json", "tcp://a:1", machine)
    assert stat.S_IMODE((tmp_path / "token.json").stat().st_mode) == 0o600
    again, bootstrap = read_token(tmp_path / "token.json")
    assert bootstrap == "tcp://a:1" and again.public_key(7) == keys.public_key(7) and again.machine == machine
    assert "swarm_secret" not in json.loads((tmp_path / "token.json").read_text())  # a machine never holds S
    keys.write_key_file(tmp_path / "k.json", 5, keys.admitted(range(12), 13))
    ident = read_key_file(tmp_path / "k.json", 5)
    assert ident.public == keys.public_key(5) and ident.keyring.owner(keys.public_key(-1)) == -1
    assert "swarm_secret" not in json.loads((tmp_path / "k.json").read_text())  # a node never holds S
    with pytest.raises(AuthError, match="for node 5; expected node 6"):
        read_key_file(tmp_path / "k.json", 6)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(AuthError, match="cannot be read"):
        read_token(tmp_path / "bad.json")


def test_an_internal_supervisor_error_is_one_swarm_error_with_the_traceback_in_the_log(
    tmp_path: Path,
) -> None:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "ours", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    reaped: list[bool] = []
    sup.host.reap_all = lambda: reaped.append(True)  # type: ignore[method-assign]

    def bug() -> dict:
        return {}["a bug"]

    sup._run = bug  # type: ignore[method-assign]
    with pytest.raises(SwarmError, match=r"internal error of the supervisor \(KeyError: 'a bug'\)") as err:
        sup.run()
    assert "\n" not in str(err.value) and reaped == [True]
    log = (tmp_path / "supervisor.log").read_text()
    assert "Traceback (most recent call last)" in log and "KeyError: 'a bug'" in log


class _Links:
    """The part of a Transport that Membership uses: dials, hang-ups, WAN locations, the keyring."""

    def __init__(self) -> None:
        self.dialled: list[tuple[int, str]] = []
        self.dropped: list[int] = []
        self.netem = SimpleNamespace(set_location=lambda pid, loc: self.located.append((pid, loc)))
        self.located: list[tuple[int, str]] = []
        self.identity = SimpleNamespace(keyring={})

    def connect(self, pid: int, address: str) -> None:
        if address == "tcp://unreachable:1":
            raise TransportError("no route")
        self.dialled.append((pid, address))

    def disconnect(self, pid: int) -> None:
        self.dropped.append(pid)


@pytest.mark.parametrize("forget", [True, False])
def test_membership_dials_listed_peers_once_and_forgets_unlisted_ones_unless_it_keeps_them(forget) -> None:
    """A node (forget) hangs up on peers no longer listed; the storage node keeps them (a late request of a
    removed node is still answered). Only new or moved peers are dialled; an unreachable one is not listed."""
    links, members = _Links(), Membership(7, forget_unlisted=forget)
    rows = [
        [7, 1, "A", "tcp://me:1"],
        [-1, -1, "A", "tcp://sup:1"],
        [3, 1, "B", "tcp://b:1"],
        [4, 2, "C", "tcp://c:1"],
    ]
    members.admit({"peers": rows, "keys": {"3": "k3"}}, links)
    assert links.dialled == [(3, "tcp://b:1"), (4, "tcp://c:1")] and links.identity.keyring == {3: "k3"}
    assert links.located == [(3, "B"), (4, "C")] and members.stage_of(4) == 2 and members.stage_of(7) is None
    moved = [[3, 1, "B", "tcp://b:2"], [5, 2, "C", "tcp://unreachable:1"]]
    members.admit({"peers": moved}, links)
    assert links.dialled[2:] == [(3, "tcp://b:2")] and 5 not in members.peers
    assert (4 in members.peers, links.dropped) == ((False, [4]) if forget else (True, []))
    members.set_members({"0": [1], "2": [4, 6]})
    assert members.serving(2) == [4, 6] and members.serving(1) == []


@pytest.mark.parametrize(("seconds", "n_keys"), [(0.3, 1), (60.0, 2), (60.0, 100)])
def test_zap_refusals_are_logged_rate_limited_with_the_right_count(caplog, seconds, n_keys) -> None:
    """500 refused handshakes (a peer retrying with an unknown key) over ``seconds``: each key's first refusal
    is named (at most REFUSAL_KEYS_NAMED keys), the rest go into at most one summary line per 10 s, and the
    lines' counts add up to 500 once the log is flushed (the transport flushes it on close)."""
    keys = SwarmKeys.new()
    ring = KeyRing({3: keys.public_key(3)})
    now = [0.0]
    ring.refusals = RefusalLog(every=10.0, clock=lambda: now[0], schedule=lambda *_: None)
    strangers = [SwarmKeys.new().public_key(0).encode() for _ in range(n_keys)]
    caplog.set_level(logging.WARNING, logger="checkfree.swarm.wire.auth")
    assert ring.callback("checkfree-swarm", keys.public_key(3).encode())
    for i in range(500):
        now[0] = seconds * i / 500
        assert not ring.callback("checkfree-swarm", strangers[i % n_keys])
    ring.refusals.flush()
    ring.refusals.flush()  # nothing pending: no line
    lines = [r.getMessage() for r in caplog.records if r.name == "checkfree.swarm.wire.auth"]
    named = [m for m in lines if "from an unknown CURVE key" in m]
    summaries = [int(re.search(r"refused (\d+) more", m).group(1)) for m in lines if " more connection" in m]
    assert len(named) == min(n_keys, REFUSAL_KEYS_NAMED)
    assert len(summaries) <= seconds / 10 + 1
    assert len(named) + sum(summaries) == 500 == ring.refusals.refused


class _FakeSwarm:
    """What an attempt talks to, on a fake clock: stage-0 nodes report ITERATION_END ``forward_s`` after
    ``begin``, every node is ready right after ``sync`` and committed right after ``commit``; each receive
    takes 10 ms."""

    def __init__(self, forward_s: float, reports: Reports) -> None:
        self.forward_s, self.t = forward_s, 0.0
        self.reports = reports
        self.sent: list[tuple[str, float]] = []
        self.kills: list[float] = []
        self.died = False
        self.attempt = 0
        self.members: dict[int, list[int]] = {}

    def broadcast(self, command: str, **meta: object) -> None:
        self.sent.append((command, self.t))
        if command == "begin":
            self.attempt = int(meta["attempt"])  # type: ignore[call-overload]
            self.members = {int(k): v for k, v in meta["members"].items()}  # type: ignore[union-attr]
        nodes = [n for ids in self.members.values() for n in ids]
        if command == "sync":
            self.reports.ready = {n: {"attempt": self.attempt, "grad_norm": 1.0} for n in nodes}
        if command == "commit":
            self.reports.committed = {n: {"attempt": self.attempt} for n in nodes}

    def recv(self, timeout: float = 0.0) -> None:
        self.t += 0.01
        begun = [t for c, t in self.sent if c == "begin"][-1]
        if self.t - begun >= self.forward_s:
            ends = {n: {"attempt": self.attempt, "loss": 1.0, "tokens": 1} for n in self.members[0]}
            self.reports.iteration_end = ends

    def kill(self, slot: object, why: str) -> None:
        slot.dead = self.died = True  # type: ignore[attr-defined]
        self.kills.append(self.t)

    def check_deaths(self) -> bool:
        died, self.died = self.died, False
        return died


@pytest.mark.parametrize(
    ("last_wall_s", "fires_at"),
    [(1.0, 0.5), (300.0, 2.0)],  # mid-forward as scheduled; after a 300 s iteration: when forward ends
)
def test_a_scheduled_crash_fires_at_its_point_or_at_the_latest_when_the_attempt_reaches_sync(
    last_wall_s, fires_at, tmp_path: Path
) -> None:
    """crash_point 0.5: the crash fires 0.5 × the last iteration's time after ``begin``, or, when that lies
    past the end of the forward phase (2 s here), as soon as every ITERATION_END is in, before ``sync``;
    the supervisor never idles until the estimated moment (before the fix: 150 s after a 300 s iteration)."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1, crash_point=0.5)
    sup = Supervisor(cfg, "ours", {1: [3]}, iterations=4, run_dir=tmp_path, vocab_size=300)
    try:
        roster = sup.roster
        for slot in roster.slots:
            slot.serving = True
            roster.by_node[slot.occupant] = slot
        fake = _FakeSwarm(forward_s=2.0, reports=sup.state.reports)
        sup.link = sup.attempts.link = sup.processes = fake  # type: ignore[assignment]
        sup.results.last_wall_s = lambda: last_wall_s  # type: ignore[method-assign]
        sup.attempts.clock = lambda: fake.t
        assert sup.drive(Attempting(3), until=lambda p: True) is False  # the death aborts the attempt
        assert fake.kills == [pytest.approx(fires_at, abs=0.02)]
        assert (
            "sync" not in [c for c, _ in fake.sent]
            and ("abort", pytest.approx(fires_at, abs=0.03)) in fake.sent
        )
        assert (1, 3) in sup.state.fired and roster.slots[1].dead
    finally:
        sup.transport.close()
