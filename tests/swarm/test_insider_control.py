"""An insider attacks a live swarm's control plane and its weights (issue 21): it holds one node's key, so it
passes CURVE and the sender binding and can send what that node could send.

One small ``ours`` swarm (3 stages x 2 replicas) serves the live tests. Each attack comes from whichever node
serves the attacked role now (an earlier test may have had a node evicted and replaced), and each test checks
what a user relies on: the iterations go on (no ``SwarmError``, no attempt redone), no forged number reaches
throughput.json, no weights leave a node for a requester the supervisor's plan does not name, and a node whose
messages keep being rejected is evicted (its key refused from then on) and replaced. The last live test stops
the swarm and reads the evictions in throughput.json. The checks themselves are also tested without processes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import zmq
from zmq.utils.monitor import recv_monitor_message

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.context import StageState
from checkfree.swarm.node.early import FutureBuffer
from checkfree.swarm.node.parts import OUTSTANDING_ANSWERS, REFUSALS_PER_WINDOW, WeightGrants
from checkfree.swarm.supervisor.conduct import EVICT_THRESHOLD, Conduct
from checkfree.swarm.supervisor.state import Attempt, Reports
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.auth import KeyRing, SwarmKeys
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

from helpers.swarm import Attacker, after_commits, node_report, running_swarm, wait_until


def _ctl(sender: int, **meta: object) -> Message:
    return Message(MessageType.CONTROL, sender, meta=meta)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(ln for ln in f if ln.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _handshake(sup: Supervisor, target: int, as_id: int, timeout: float = 5.0) -> str:
    """Open a fresh CURVE connection to ``target`` (-1: the supervisor) with the key of ``as_id``: 'ok' when
    the handshake succeeds, 'refused' when the target's ZAP check refuses the key."""
    keys = sup.state.keys  # the supervisor's: every identity's key
    assert keys is not None
    address = sup.address if target == SUPERVISOR_ID else sup.node_address(target)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = keys.public_key(target).encode()
    sock.curve_secretkey = keys.secret_key(as_id)
    sock.curve_publickey = keys.public_key(as_id).encode()
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        sock.connect(address)
        if not monitor.poll(timeout * 1000):
            return "no answer"
        event = recv_monitor_message(monitor)["event"]
        return "ok" if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else "refused"
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


# ------------------------------------------------------------------------------ the checks, without processes


def test_one_accuser_cannot_evict_a_node_but_two_reporters_or_the_supervisor_can() -> None:
    t = [0.0]
    roster = SimpleNamespace(revoked=set(), by_node={}, storage=None)
    conduct = Conduct(roster, threshold=16, window_s=60.0, clock=lambda: t[0])  # type: ignore[arg-type]
    conduct.reported(7, {"3": 1000})  # one reporter: node 7 says node 3 sent 1,000 bad messages
    conduct.accused(7, [3] * 50)
    assert conduct.score(3) == 0  # its largest accuser is left out: one key frames nobody
    conduct.reported(8, {"3": 10})  # a second reporter saw 10 of them
    assert conduct.score(3) == 10
    conduct.reported(8, {"3": 10})  # cumulative counters: no increase, nothing new
    assert conduct.score(3) == 10
    for _ in range(7):
        conduct.offence(3, "an impossible claim")  # the supervisor's own verdicts count in full
    assert conduct.score(3) == 17 > EVICT_THRESHOLD
    conduct.offence(4, "one")
    t[0] = 61.0  # outside the window: forgotten
    assert conduct.score(3) == 0 and conduct.score(4) == 0
    conduct.reported(8, {"-1": 5, "3": 11})  # a node's word about the supervisor is no evidence
    assert conduct.evidence(-1) == (0, {}) and conduct.score(3) == 0  # 1 new, from the largest accuser


def test_a_revoked_key_is_refused_for_good_and_its_messages_no_longer_map_to_an_id(tmp_path: Path) -> None:
    keys = SwarmKeys.new()
    ring = KeyRing({n: keys.public_key(n) for n in range(4)})
    key2 = keys.public_key(2)
    ring.revoke([2])
    assert ring.owner(key2) is None and not ring.callback("checkfree-swarm", key2.encode())
    ring.update({n: keys.public_key(n) for n in range(4)})  # a later 'keys' list does not re-admit it
    assert ring.owner(key2) is None and ring.owner(keys.public_key(3)) == 3
    keys.revoked.add(2)
    keys.write_key_file(tmp_path / "k.json", 5, keys.admitted(range(6), 6))  # written after it: omits it
    listed = json.loads((tmp_path / "k.json").read_text())["keys"]
    assert "2" not in listed and "3" in listed


def _grants() -> tuple[WeightGrants, list[float], Message]:
    module = torch.nn.Linear(4, 4)
    state = StageState(module, W.make_optimizer(module, 1e-3))
    t = [0.0]
    grants = WeightGrants(state, window_s=60.0, clock=lambda: t[0])
    req = Message(
        MessageType.WEIGHTS_REQUEST, 9, meta={"stage": 2, "request": "a", "optimizer": True, "seq": 0}
    )
    return grants, t, req


def _ask(grants: WeightGrants, req: Message, **meta: object) -> tuple[str, str | None, bool]:
    """(action, refusal reason, offence) of a request like ``req`` with ``meta`` changed."""
    v = grants.judge(Message(MessageType.WEIGHTS_REQUEST, req.sender, meta=req.meta | meta))
    return v.action, v.reason, v.offence


def test_weights_go_only_to_the_replacement_a_plan_names_once_per_plan() -> None:
    grants, t, req = _grants()
    assert _ask(grants, req) == ("wait", None, False)  # no grant yet: the request waits for one
    assert grants.judge(Message(MessageType.WEIGHTS_REQUEST, SUPERVISOR_ID, meta=req.meta)).action == "serve"
    grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": 0})
    assert _ask(grants, req) == ("serve", None, False)
    grants.answered(req, 100)
    assert _ask(grants, req) == ("refuse", "grant_used", True)  # a second request under the same plan
    assert _ask(grants, req, stage=1) == ("refuse", "no_grant", True)  # another stage
    assert _ask(grants, req, seq=1) == ("wait", None, False)  # a newer plan, whose grant is on its way
    grants.grant({"requester": 9, "stage": 2, "optimizer": False, "seq": 1})  # a new plan: one answer more
    assert _ask(grants, req, seq=1) == ("refuse", "no_grant", True)  # its new plan takes no Adam state
    assert _ask(grants, req, seq=1, optimizer=False) == ("serve", None, False)
    assert _ask(grants, req, seq=0) == ("refuse", "plan_superseded", False)  # a late request: no offence
    grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": 0})  # an older plan, overtaken
    assert _ask(grants, req, seq=1) == ("refuse", "no_grant", True)
    no_plan = {k: v for k, v in req.meta.items() if k != "seq"}
    assert grants.judge(Message(MessageType.WEIGHTS_REQUEST, 9, meta=no_plan)).reason == "no_grant"


def test_a_late_request_does_not_use_up_the_grant_of_the_plan_that_replaced_it() -> None:
    """Seed-7 soak: a replacement asked a source under plan 0, got plan 1 and asked again; the source took the
    plan-0 request under the plan-1 grant, then dropped the plan-1 request as 'answered already', and the
    replacement waited out request_timeout. Now the late request is refused and the grant stays for plan 1."""
    grants, t, req = _grants()
    grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": 0})
    grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": 1})  # plan 1 replaced plan 0
    assert _ask(grants, req, seq=0) == ("refuse", "plan_superseded", False)
    assert _ask(grants, req, seq=1) == ("serve", None, False)


def test_a_requester_cycling_plans_is_held_to_the_cap_on_outstanding_bytes() -> None:
    grants, t, req = _grants()
    full = 3 * sum(v.numel() * v.element_size() for v in grants.state.module.state_dict().values())
    for seq in range(OUTSTANDING_ANSWERS):
        grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": seq})
        assert _ask(grants, req, seq=seq) == ("serve", None, False)
        grants.answered(req, full)
    grants.grant({"requester": 9, "stage": 2, "optimizer": True, "seq": 9})
    assert _ask(grants, req, seq=9) == ("refuse", "byte_cap", True)
    t[0] = 61.0  # the answers left the window
    assert _ask(grants, req, seq=9) == ("serve", None, False)


def test_refusals_are_bounded_per_requester_and_a_wait_for_a_grant_ends() -> None:
    grants, t, req = _grants()
    assert [grants.may_refuse(9) for _ in range(REFUSALS_PER_WINDOW + 2)].count(True) == REFUSALS_PER_WINDOW
    assert grants.may_refuse(8) and grants.refused["withheld"] == 2  # another requester has its own budget
    t[0] = 61.0
    assert grants.may_refuse(9)  # the window moved on
    assert not grants.overdue(req)  # its wait starts when it is first asked about
    t[0] += grants.wait_s
    assert grants.overdue(req) and grants.wait_s == 5.0


def test_requests_waiting_for_a_grant_are_bounded_per_sender() -> None:
    buf = FutureBuffer(max_messages=64, max_bytes=64 * 1024, per_sender=4)
    for i in range(4):
        buf.add(Message(MessageType.WEIGHTS_REQUEST, 3, meta={"stage": 2, "request": str(i)}))
    with pytest.raises(ProtocolError, match="holds 4 of node 3"):
        buf.add(Message(MessageType.WEIGHTS_REQUEST, 3, meta={"stage": 2, "request": "x"}))
    buf.add(Message(MessageType.WEIGHTS_REQUEST, 4, meta={"stage": 2, "request": "y"}))  # another sender


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    """A supervisor of configs/tiny_config.json (stages 0..4, 1 replica), every slot serving, an attempt of
    attempt 7 begun at t = 100 s on a fake clock; no process is started."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1, microbatch_timeout=30.0)
    sup = Supervisor(cfg, "ours", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    for slot in sup.roster.slots:
        slot.serving, slot.address = True, f"tcp://127.0.0.1:{7000 + slot.slot}"
        sup.roster.by_node[slot.occupant] = slot
    sup.state.attempt = 7
    sup.state.current = Attempt(7, 3, sup.roster.members(), t_begin=100.0)
    sup.peer_messages.clock = lambda: sup.now  # type: ignore[attr-defined]
    sup.now = 101.0  # type: ignore[attr-defined]
    yield sup
    sup.transport.close()


def test_a_stall_is_taken_only_when_a_microbatch_can_have_timed_out(sup: Supervisor) -> None:
    handle, reports = sup.peer_messages.handle, sup.state.reports
    bad = sup.peer_messages.bad_messages
    handle(_ctl(0, command="stalled", attempt=7, reason="forged"))  # 1 s after begin: impossible
    handle(_ctl(1, command="stalled", attempt=7, reason="not stage 0"))
    handle(_ctl(0, command="stalled", attempt=8, reason="an attempt not begun"))
    handle(_ctl(0, command="stalled", attempt=6, reason="stale: ignored, not counted"))
    assert not reports.stalled and sup.peer_messages.bad_messages == bad + 3
    sup.now = 130.0  # microbatch_timeout after begin: a genuine stall is possible
    handle(_ctl(0, command="stalled", attempt=7, reason="microbatch 0 not back after 30 s"))
    assert set(reports.stalled) == {0}
    handle(_ctl(0, command="stalled", attempt=7, reason="again"))  # once per attempt
    assert sup.peer_messages.bad_messages == bad + 4
    assert sup.conduct.evidence(0)[0] == 3 and sup.conduct.evidence(1)[0] == 1


def test_only_a_stage_0_member_may_report_a_stall(sup: Supervisor) -> None:
    """A stall aborts and redoes the attempt, and only a stage-0 node drives a pipeline: a transformer stage's
    member reporting one, even when a microbatch could have timed out, is refused and counted against it."""
    handle, reports = sup.peer_messages.handle, sup.state.reports
    bad = sup.peer_messages.bad_messages
    sup.now = 131.0  # past microbatch_timeout: the claim fails only for who makes it
    for node in (1, 2, 4):  # stages 1, 2 and S: members of attempt 7, none of stage 0
        handle(_ctl(node, command="stalled", attempt=7, reason="microbatch 0 not back after 30 s"))
    assert not reports.stalled and sup.peer_messages.bad_messages == bad + 3
    assert all(sup.conduct.evidence(n)[0] == 1 for n in (1, 2, 4))
    handle(_ctl(0, command="stalled", attempt=7, reason="microbatch 0 not back after 30 s"))
    assert set(reports.stalled) == {0}


def test_ready_committed_and_iteration_end_must_fit_the_attempts_phase(sup: Supervisor) -> None:
    handle, reports, current = sup.peer_messages.handle, sup.state.reports, sup.state.current
    bad = sup.peer_messages.bad_messages
    handle(_ctl(2, command="ready", attempt=7, grad_norm=1.0, pipelines=1.0))  # before sync
    handle(_ctl(2, command="committed", attempt=7, **_stats(4)))  # before commit
    tokens = sup.cfg.mb_count * sup.cfg.model.batch_size * sup.cfg.model.seq_l
    end = {"stage": 0, "attempt": 7, "loss": 2.0, "seconds": 1.0}
    handle(Message(MessageType.ITERATION_END, 0, meta=end | {"tokens": tokens + 1}))  # not a pipeline's
    handle(Message(MessageType.ITERATION_END, 1, meta=end | {"tokens": tokens}))  # not stage 0
    assert sup.peer_messages.bad_messages == bad + 4 and reports == Reports()
    handle(Message(MessageType.ITERATION_END, 0, meta=end | {"tokens": tokens}))
    assert set(reports.iteration_end) == {0}
    current.phase = "sync"
    handle(_ctl(2, command="ready", attempt=7, grad_norm=1.0, pipelines=2.0))  # 2 pipelines of 1
    handle(_ctl(2, command="ready", attempt=7, grad_norm=1.0, pipelines=1.0, rejected=[3]))  # not its replica
    handle(_ctl(2, command="ready", attempt=7, grad_norm=1.5, pipelines=1.0))
    handle(_ctl(2, command="ready", attempt=7, grad_norm=9.0, pipelines=1.0))  # a second one
    assert reports.ready[2]["grad_norm"] == 1.5 and sup.peer_messages.bad_messages == bad + 7
    current.phase = "commit"
    handle(_ctl(2, command="committed", attempt=7, **_stats(9)))  # not the version commit 3 gives
    handle(_ctl(2, command="committed", attempt=7, **_stats(4)))
    assert set(reports.committed) == {2} and sup.peer_messages.bad_messages == bad + 8


def _stats(version: int) -> dict:
    return {
        "sent_bytes": {},
        "sent_messages": {},
        "dropped_malformed": 0,
        "bad_messages": 0,
        "compute": {},
        "version": version,
    }


def test_replan_is_answered_once_per_plan_and_only_to_a_recovering_replacement(sup: Supervisor) -> None:
    handle, reports = sup.peer_messages.handle, sup.state.reports
    slot = sup.roster.slots[2]
    handle(_ctl(2, command="replan", reason="x", seq=0))  # it serves
    slot.serving, slot.plan_seq = False, 1
    handle(_ctl(2, command="replan", reason="x", seq=10**9))  # a plan it was never sent
    handle(_ctl(2, command="replan", reason="x", seq=0))  # a stale one: ignored
    assert not reports.replan and sup.peer_messages.bad_messages == 2
    handle(_ctl(2, command="replan", reason="sources gone", seq=1))
    assert reports.replan[2]["seq"] == 1
    slot.replans = sup.cfg.max_attempts  # it was answered max_attempts times already
    reports.clear()
    handle(_ctl(2, command="replan", reason="sources gone", seq=1))
    assert not reports.replan and sup.peer_messages.bad_messages == 3


# ------------------------------------------------------------------------------ a live swarm


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    yield from running_swarm(tmp_path_factory.mktemp("insider_control"))


def _serving(sup: Supervisor, stage: int, index: int) -> int:
    """The node serving ``stage`` at position ``index`` now (waits until every slot serves)."""
    wait_until(lambda: sup.roster.all_serving() and len(sup.roster.members()[stage]) > index, sup)
    return sup.roster.members()[stage][index]


def _evicted(sup: Supervisor) -> set[int]:
    return {e["node"] for e in sup.results.evictions}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_forged_stalled_flood_redoes_no_attempt_and_evicts_its_sender(swarm: Supervisor) -> None:
    node = _serving(swarm, 0, 1)  # drives pipeline 1: its stalls are the ones the supervisor acts on
    failed, rows = dict(swarm.state.failed_attempts), len(swarm.results.rows)
    attacker = Attacker(swarm, SUPERVISOR_ID, as_id=node)
    try:
        for _ in range(32):  # in 0.7 s, each for the attempt running as it is sent
            attacker.send(_ctl(node, command="stalled", attempt=swarm.state.attempt, reason="forged"))
            time.sleep(0.02)
    finally:
        attacker.close()
    after_commits(swarm, 5)
    assert swarm.state.failed_attempts == failed  # no attempt was redone for a stall
    assert all(math.isfinite(r["loss"]) for r in swarm.results.rows[rows:])
    assert node in _evicted(swarm)  # 32 impossible claims > EVICT_THRESHOLD


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_forged_ready_with_a_nan_gradient_norm_is_rejected(swarm: Supervisor) -> None:
    node = _serving(swarm, 2, 1)
    rows, malformed = len(swarm.results.rows), swarm.transport.stats["dropped_malformed"]
    attacker = Attacker(swarm, SUPERVISOR_ID, as_id=node)
    try:
        for norm in (math.nan, math.inf, math.nan, -1.0, math.nan):  # one per attempt, as 'sync' begins:
            done = len(swarm.results.rows)  # before the genuine ready, had it been taken
            wait_until(lambda: swarm.state.current.phase == "sync", swarm)
            attacker.send(
                _ctl(node, command="ready", attempt=swarm.state.attempt, grad_norm=norm, pipelines=1.0)
            )
            wait_until(lambda: len(swarm.results.rows) > done, swarm)  # noqa: B023
    finally:
        attacker.close()
    after_commits(swarm, 2)
    assert swarm.transport.stats["dropped_malformed"] == malformed + 5  # each one refused by its schema
    norms = [v for r in swarm.results.rows[rows:] for v in r["grad_norms"].values()]
    assert norms and all(math.isfinite(v) and v >= 0 for v in norms)  # ω stays a gradient norm
    assert swarm.conduct.evidence(node)[0] >= 5 and node not in _evicted(swarm)  # counted, below the limit


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_weights_request_flood_for_another_stage_gets_nothing_and_the_victim_stays_flat(
    swarm: Supervisor,
) -> None:
    victim, node = _serving(swarm, 2, 0), _serving(swarm, 1, 0)  # a stage-1 node asks for stage 2
    pid = swarm.host.procs[victim].pid
    after_commits(swarm, 1)
    report = node_report(swarm, victim)
    rss, sent = _rss_mib(pid), report["sent_bytes"].get("WEIGHTS_RESPONSE", 0)
    answers = report["sent_messages"].get("WEIGHTS_RESPONSE", 0)
    attacker = Attacker(swarm, victim, as_id=node)

    def refused() -> int:
        return node_report(swarm, victim).get("rejected_from", {}).get(str(node), 0)

    try:
        for i in range(10_000):
            meta = {"stage": 2, "request": f"r{i}", "optimizer": True}
            attacker.send(Message(MessageType.WEIGHTS_REQUEST, node, meta=meta))
        counts = [-1]  # until the victim has read them all: its count stops growing over two commits
        while counts[-1] < refused() or len(counts) < 3:
            counts.append(refused())
            after_commits(swarm, 1)
    finally:
        attacker.close()
    after_commits(swarm, 2)
    report = node_report(swarm, victim)
    # no weights: only the 4 requests that waited for a grant are refused once their wait is over (no_grant), a
    # few bytes each; the rest were dropped and counted
    refusals = report["sent_messages"].get("WEIGHTS_RESPONSE", 0) - answers
    assert refusals <= 4 and report["sent_bytes"].get("WEIGHTS_RESPONSE", 0) - sent <= 4 * 256
    assert report.get("refused_requests", {}).get("no_grant", 0) == refusals
    assert _rss_mib(pid) < rss + 50  # it used to grow by ~500 MB while it queued the answers
    assert refused() >= 9_000  # refused and counted per sender


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_repeat_offender_is_evicted_refused_and_replaced(swarm: Supervisor) -> None:
    node = _serving(swarm, 1, 1)
    slot = swarm.roster.by_node[node]
    peer = _serving(swarm, 2, 0)
    assert _handshake(swarm, SUPERVISOR_ID, node) == "ok" and _handshake(swarm, peer, node) == "ok"
    attacker = Attacker(swarm, SUPERVISOR_ID, as_id=node)
    try:
        for _ in range(6):  # 24 claims that cannot be true of a serving stage-1 node
            attempt = swarm.state.attempt
            attacker.send(
                _ctl(node, command="replan", reason="forged", seq=0),
                _ctl(node, command="recovery_failed", reason="forged"),
                _ctl(node, command="ready", attempt=attempt + 5, grad_norm=1.0, pipelines=1.0),
                Message(
                    MessageType.ITERATION_END,
                    node,
                    meta={"stage": 1, "attempt": attempt, "loss": 1.0, "tokens": 1, "seconds": 1.0},
                ),
            )
        wait_until(lambda: node in _evicted(swarm), swarm, timeout=20)
        spoofed = swarm.transport.stats["dropped_spoofed"]
        attacker.send(_ctl(node, command="replan", reason="after the eviction", seq=0))
        wait_until(lambda: swarm.transport.stats["dropped_spoofed"] > spoofed, swarm, timeout=10)
    finally:
        attacker.close()
    assert _handshake(swarm, SUPERVISOR_ID, node) == "refused"  # its next connection fails
    wait_until(
        lambda: _handshake(swarm, peer, node) == "refused", swarm, timeout=20
    )  # at every node, once told
    wait_until(lambda: slot.occupant != node and slot.serving, swarm, timeout=60)  # replaced as if it crashed
    after_commits(swarm, 2)
    record = next(e for e in swarm.results.evictions if e["node"] == node)
    assert record["replaced"] and record["rejected_by_supervisor"] > EVICT_THRESHOLD
    assert record["slot"] == slot.slot and record["stage"] == 1


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_evictions_are_in_throughput_json(swarm: Supervisor) -> None:
    evicted = _evicted(swarm)
    swarm.iterations = 0
    swarm.thread.join(timeout=60)  # type: ignore[attr-defined]
    assert not swarm.thread.is_alive()  # type: ignore[attr-defined]
    data = json.loads((swarm.run_dir / "throughput.json").read_text())
    assert data["status"] == "completed"
    assert {e["node"] for e in data["evictions"]} == evicted and len(evicted) >= 2
    causes = {c["node"]: c["cause"] for c in data["crashes"]}
    assert all(causes[n].startswith("evicted: more than") for n in evicted if n in causes)
    assert all(math.isfinite(loss) for _, loss in data["loss_curve"])
