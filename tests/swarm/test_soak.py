"""Churn without stalls: a recovery whose sources die mid-fetch is planned again at once, a lost stage 0 is
planned only from copy holders that hold a copy, the recovery-kill hook, and the soak script's schedules and
verdicts (benchmarks/soak_swarm.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from checkfree.failures.schedules import load_node_schedule
from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.recovery_kills import RecoveryKill, RecoveryKills, load_recovery_kills
from checkfree.swarm.supervisor.state import Attempt, Roster
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError
from checkfree.swarm.wire import control
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, MessageType, ProtocolError

from helpers import ROOT
from helpers.swarm import FakeNode, live_config, stage0_copies_of, state_of, weights_answer


def _soak():
    spec = importlib.util.spec_from_file_location("soak_swarm", ROOT / "benchmarks" / "soak_swarm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ sources gone: ask, re-plan, start over


def test_a_fetch_whose_sources_all_left_asks_the_supervisor_at_once_and_runs_its_new_plan() -> None:
    """Node 20 copies stage 1 from its only serving node 3. Node 3 leaves the swarm: no request goes to it
    again (before the fix it was asked until the supervisor's recovery timeout, 180 s); the supervisor is asked
    for a new plan at once, the fetch waits for it (no request deadline fires meanwhile), then runs it."""
    node = FakeNode()
    node.membership.members = {1: [3]}
    rec = node.recovery(RecoveryPlan("replica", (1,), with_optimizer=True, fresh_lr_scale=False))
    rec.start()
    ((target, first),) = node.sent
    assert target == 3
    node.membership.peers.pop(3)
    rec.peers_changed()
    assert len(node.sent) == 2
    to, ask = node.sent[-1]
    assert to == SUPERVISOR_ID and ask["command"] == "replan" and ask["seq"] == 0
    assert "every source of stage 1 left the swarm (node 3 left the swarm)" in ask["reason"]
    control.check(Message(MessageType.CONTROL, 20, meta=ask))  # it fits its schema
    rec.requests[0]["deadline"] = 0.0  # a request deadline passes while it waits: nothing is resent
    rec.tick()
    rec.peers_changed()
    assert len(node.sent) == 2 and not node.gave_up
    # the supervisor's new plan: copy stage 2, whose node 7 serves now
    node.membership.peers[7] = {"stage": 2}
    rec.replan(RecoveryPlan("copy", (2,)), {"1": [], "2": [7]}, seq=1)
    to, request = node.sent[-1]
    assert to == 7 and request["stage"] == 2 and not request.get("optimizer")
    with pytest.raises(ProtocolError, match="runs plan 1 already"):
        rec.replan(RecoveryPlan("copy", (2,)), {"2": [7]}, seq=1)  # a replayed plan
    rec.on_response(weights_answer(node, 3, first["request"]))  # a late answer to the dropped plan: ignored
    assert not node.done and not node.rejected
    rec.on_response(weights_answer(node, 7, request["request"], meta={"stage": 2}))
    ((state, record),) = node.done
    assert (record["rule"], record["source_nodes"], record["source_stages"]) == ("copy", [7], [2])
    assert not node.gave_up


def test_a_replacement_that_gets_no_new_plan_in_time_gives_up() -> None:
    node = FakeNode()
    node.membership.members = {1: []}  # no serving node of the source stage at all
    rec = node.recovery(RecoveryPlan("replica", (1,)))
    rec.start()
    assert [m["command"] for _, m in node.sent] == ["replan"] and not node.gave_up
    rec.plan_deadline = time.monotonic() - 1
    rec.tick()
    assert node.gave_up and "no new recovery plan from the supervisor within 60 s" in node.gave_up[0]


def _supervisor(tmp_path: Path, setting: str) -> Supervisor:
    """A supervisor of configs/tiny_config.json's 4 transformer stages, 1 replica each, every slot serving;
    the commands it sends are recorded in ``.sent``."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, setting, {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    sup.sent = []  # type: ignore[attr-defined]
    sup.link.command = lambda to, command, **meta: sup.sent.append((to, command, meta))  # type: ignore
    for slot in sup.roster.slots:
        slot.serving, slot.address = True, f"tcp://127.0.0.1:{7000 + slot.slot}"
        sup.roster.by_node[slot.occupant] = slot
    return sup


def test_the_supervisor_plans_a_stage_again_from_the_live_stages_and_tells_its_replacement(tmp_path) -> None:
    sup = _supervisor(tmp_path, "ours")
    try:
        # stage 2 was lost; its replacement 20 joined and fetches by CheckFree from stages 1 and 3
        slot2 = sup.roster.slots[2]
        slot2.serving, slot2.occupant, slot2.plan = False, 20, RecoveryPlan("checkfree", (1, 3))
        sup.roster.by_node[20] = slot2
        slot3 = sup.roster.slots[3]  # then stage 3's only node dies mid-fetch: a new loss event
        slot3.serving, slot3.dead = False, True
        sup.planner.plan_event(sup.roster.lost_stages())
        ((to, command, meta),) = sup.sent  # the changed plan goes to the recovering replacement unasked
        plan = RecoveryPlan.from_json(meta["plan"], 4)
        assert (to, command, meta["seq"], plan.rule, plan.sources) == (20, "plan", 1, "checkfree", (1, 4))
        assert meta["members"]["3"] == [] and meta["members"]["4"] == [4]
        control.check(Message(MessageType.CONTROL, SUPERVISOR_ID, meta={"command": command, **meta}))
        assert slot3.plan == RecoveryPlan("checkfree", (1, 4))  # its replacement gets it in its WELCOME
        # the replacement asked before that plan reached it (seq 0): it is not sent twice
        sup.state.reports.replan = {20: {"command": "replan", "reason": "sources gone", "seq": 0}}
        sup.planner.answer_replans()
        assert len(sup.sent) == 1
        # it asks while running plan 1 (say its members were stale): the plan of now, again, with members
        sup.state.reports.replan = {20: {"command": "replan", "reason": "sources gone", "seq": 1}}
        sup.planner.answer_replans()
        assert [(to, c, m["seq"]) for to, c, m in sup.sent] == [(20, "plan", 1), (20, "plan", 2)]
        # an unchanged plan is not resent at the next loss event
        sup.planner.plan_event(sup.roster.lost_stages())
        assert len(sup.sent) == 2
    finally:
        sup.transport.close()


def test_a_replica_rebuilt_by_another_plan_than_its_serving_sibling_is_killed(tmp_path) -> None:
    """Two replicas of stage 2 must serve alike: the second to report ``serving`` rebuilt by another plan
    (it raced a new plan) is killed, and planned again as a copy of the first."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)
    sup = Supervisor(cfg, "ours", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    try:
        killed = []
        sup.processes.kill = lambda slot, why: (
            killed.append((slot.occupant, why)),
            setattr(slot, "dead", True),
        )
        for slot in sup.roster.slots:
            slot.serving = slot.stage != 2
            sup.roster.by_node[slot.occupant] = slot
        a, b = sup.roster.slots[4], sup.roster.slots[5]
        record = {"rule": "checkfree", "source_stages": [1, 3], "parts": None, "fallback": None}
        sup.execute(sup.peer_messages._on_serving(a, {"stage": 2, "version": 0, "record": record}))
        sup.execute(
            sup.peer_messages._on_serving(
                b, {"stage": 2, "version": 0, "record": {**record, "source_stages": [1, 4]}}
            )
        )
        assert a.serving and not b.serving and b.dead and killed[0][0] == b.occupant
        assert "node 4 serves stage 2 rebuilt by checkfree from stages (1, 3)" in killed[0][1]
        sup.planner.plan_event(sup.roster.lost_stages())
        assert b.plan.rule == "replica"
        b.dead = False
        sup.execute(
            sup.peer_messages._on_serving(b, {"stage": 2, "version": 0, "record": {"rule": "replica"}})
        )
        assert b.serving and len(killed) == 1
    finally:
        sup.transport.close()


# ------------------------------------------------------------------ stage 0 only from holders holding a copy


def test_a_lost_stage_0_is_planned_only_from_copy_holders_that_hold_a_copy(tmp_path) -> None:
    """After a 0+1 loss the rebuilt stage-1 node holds no copy of the embedding (stage 0 was lost: nobody
    pushed one): the next plan of stage 0 takes the random-init fallback for the embedding at once instead of
    asking it (before the fix: 10 refusals "holds no copy", then the recovery failed)."""
    sup = _supervisor(tmp_path, "ours-plus")
    try:
        sup.state.current = Attempt(9, 7, sup.roster.members(), t_begin=0.0)
        reports = sup.peer_messages
        stage1, stage4 = sup.roster.slots[1], sup.roster.slots[4]
        committed = {"command": "committed", "attempt": 9, "version": 7}
        reports._on_report(stage4, committed | {"stage0_copy": 7})
        sup.roster.slots[0].serving = False  # stage 0 is lost; stage 1 serves, rebuilt: it reported no copy
        sup.planner.plan_event(sup.roster.lost_stages())
        plan = sup.roster.slots[0].plan
        assert (plan.rule, plan.sources, plan.parts) == ("stage0_copy", (4,), ("head",))
        assert plan.fallback == "copy holder holds no copy yet: random init of ['embedding']"
        reports._on_report(stage1, committed | {"stage0_copy": 7})  # once it holds one, it is a source
        sup.planner.plan_event(sup.roster.lost_stages())
        plan = sup.roster.slots[0].plan
        assert (plan.sources, plan.parts, plan.fallback) == ((1, 4), ("embedding", "head"), None)
        sup.host.spawn = lambda *args, **kwargs: 0  # type: ignore[method-assign]
        sup.processes.spawn(stage1, replacement=True)  # a new occupant holds nothing
        assert stage1.copy_version is None and 1 not in sup.roster.holding_stages()
        with pytest.raises(ProtocolError, match="stage-2 node, which holds none"):
            reports._on_report(sup.roster.slots[2], committed | {"stage0_copy": 7})
        with pytest.raises(ProtocolError, match="ahead of iteration 7"):
            reports._on_report(stage4, committed | {"stage0_copy": 99})
    finally:
        sup.transport.close()


def test_a_holder_reports_the_copy_it_holds() -> None:
    holder = stage0_copies_of(1)
    assert holder.report() == {}
    holder.on_copy(
        Message(
            MessageType.STAGE0_COPY,
            0,
            0,
            -1,
            {"stage": 0, "part": "embedding", "version": 3},
            {"w.embed_tokens.weight": torch.ones(4, 2)},
        )
    )
    assert holder.report() == {"stage0_copy": 3}
    assert stage0_copies_of(2).report() == {} and stage0_copies_of(1, "ours").report() == {}


# ------------------------------------------------------------------ the recovery-kill hook


def test_recovery_kills_hit_a_recovering_replacement_or_its_sources(tmp_path: Path) -> None:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=2)
    roster = Roster(cfg, 0, cfg.n_nodes, storage=False)
    for slot in roster.slots:
        slot.serving, slot.address = True, "tcp://a:1"
    recovering = roster.slots[5]  # stage 2, replica 1: its replacement 30 copies replica 4
    recovering.serving, recovering.occupant = False, 30
    recovering.plan = RecoveryPlan("replica", (2,), with_optimizer=True, fresh_lr_scale=False)
    now = [100.0]
    killed: list[tuple[int, str]] = []
    kills = [RecoveryKill(3, "source", 0.5), RecoveryKill(3, "replacement", 0.0), RecoveryKill(9, "source")]
    hook = RecoveryKills(kills, roster, clock=lambda: now[0])

    def tick() -> None:  # the supervisor's recovery loop, recovering from a loss in iteration 3, kills them
        for slot, why in hook.tick(3):
            killed.append((slot.occupant, why))
            slot.dead = True

    tick()
    assert killed == [(30, "recovery kill: replacement while it recovers")]
    recovering.dead, recovering.occupant = False, 31  # its next replacement
    tick()
    assert len(killed) == 1  # the source kill waits 0.5 s after it joined
    now[0] += 0.6
    tick()
    assert killed[1] == (4, "recovery kill: source of node 31 (stage 2) mid-fetch")
    assert [k.fired for k in kills] == [True, True, False]
    assert hook.fired[1] == {"iteration": 3, "kind": "source", "replacement": 31, "killed": [4]}
    bad = tmp_path / "kills.json"
    for text, match in [
        ("[", "is not valid JSON"),
        ('{"format": "x", "kills": []}', "is not"),
        ('{"format": "checkfree-recovery-kills-v1", "kills": [{"iteration": 1, "kind": "all"}]}', "kind"),
        ('{"format": "checkfree-recovery-kills-v1", "kills": [{"iteration": 1, "after_s": -1}]}', "entry"),
    ]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_recovery_kills(bad)
    with pytest.raises(FileNotFoundError):
        load_recovery_kills(tmp_path / "none.json")


# ------------------------------------------------------------------ the soak script


def test_the_soak_schedule_mixes_every_kind_and_aims_at_the_deaths_asked(tmp_path: Path) -> None:
    soak = _soak()
    schedule, kills, events = soak.make_schedules(4, 2, 40, 100, seed=0)
    assert {e["kind"] for e in events} == set(soak.EVENT_KINDS)
    assert 100 <= sum(e["expected_deaths"] for e in events) <= 104
    assert min(e["iteration"] for e in events) >= 2 and max(e["iteration"] for e in events) <= 39
    assert any(e["kind"] == "pair" and 0 in e["slots"] for e in soak.make_schedules(4, 2, 330, 1000)[2])
    (tmp_path / "schedule.json").write_text(json.dumps(schedule))
    nodes = load_node_schedule(tmp_path / "schedule.json")  # the format swarm run replays
    assert sum(len(v) for v in nodes.values()) == sum(len(e["slots"]) for e in events)
    for it in {e["iteration"] for e in events}:  # one iteration's events kill disjoint slots
        slots = [n for e in events if e["iteration"] == it for n in e["slots"]]
        assert len(slots) == len(set(slots)) <= 5
    (tmp_path / "kills.json").write_text(json.dumps({"format": soak.KILLS_FORMAT, "kills": kills}))
    loaded = load_recovery_kills(tmp_path / "kills.json")
    assert sorted(k.kind for k in loaded) == sorted(
        e["kind"] for e in events if e["kind"] in ("replacement", "source")
    )
    with pytest.raises(ValueError, match="--iterations is 2"):
        soak.make_schedules(4, 2, 2, 10)


def _log(*causes: tuple[int, str]) -> str:
    return "\n".join(
        f"2026-01-01 00:00:00,000 WARNING checkfree.swarm.supervisor.supervisor: supervisor: node {10 + i} "
        f"(slot {i}, stage {stage}) is gone: {cause}"
        for i, (stage, cause) in enumerate(causes)
    )


def test_the_soak_report_counts_deaths_by_kind_and_says_missed_when_a_target_is_missed() -> None:
    soak = _soak()
    log = _log(
        (1, "scheduled crash at iteration 3"),
        (1, "scheduled crash at iteration 3"),
        (2, "recovery kill: replacement while it recovers"),
        (0, "recovery kill: source of node 31 (stage 0) mid-fetch"),
        (-1, "process exited with code -9"),
        (3, "not serving within 180 s"),
    )
    walls = [2.0] * 9 + [40.0]
    throughput = {
        "crashes": [{"latency_s": x} for x in (3.0, 4.0, 5.0)],
        "iterations": [{"iteration": i, "wall_s": w} for i, w in enumerate(walls)],
        "recovered_count": 3,
        "crashes_count": 3,
        "iterations_completed": 10,
        "iterations_executed": 10,
        "aborted_attempts": 4,
        "total_s": sum(walls),
        "useful_work_fraction": 0.4237,
    }
    flat = [{"fds": 40, "rss_mib": 200.0} for _ in range(8)]
    lines = soak.report(throughput, log, flat)
    text = "\n".join(lines)
    assert "useful-work fraction within the run" in text and text.count(": 0.42\n") == 1
    no_clean = "\n".join(soak.report({**throughput, "useful_work_fraction": None}, log, flat))
    assert "issue 39 compares with a crash-free run instead): none (no clean iteration)" in no_clean
    older = {k: v for k, v in throughput.items() if k != "useful_work_fraction"}
    assert "useful-work" not in "\n".join(soak.report(older, log, flat))
    assert "deaths: 6" in text and "  scheduled: 2" in text and "  storage node killed: 1" in text
    assert "  replacement killed while recovering: 1" in text and "  source killed mid-fetch: 1" in text
    assert "  not serving in time: 1" in text
    assert "crash -> serving: median 4.00 s, p95 5.00 s" in text
    assert "longest 40.00 s (iteration 9), 20.0x the median" in text
    # a 38 s stall > median crash->serving 4 s + 10 s: missed; fds and RSS flat: met
    assert lines[-3].startswith("stall 38.0 s <= median crash->serving + 10 s = 14.0 s") and lines[
        -3
    ].endswith(": missed")
    assert lines[-2].startswith("fds flat") and lines[-2].endswith(": met")
    assert lines[-1].startswith("rss_mib flat") and lines[-1].endswith(": met")
    leaking = [{"fds": 40 + 10 * i, "rss_mib": 200.0 + 40 * i} for i in range(8)]
    quiet = {**throughput, "iterations": [{"iteration": i, "wall_s": 2.0 + (i == 9)} for i in range(10)]}
    lines = soak.report(quiet, log, leaking)
    assert [line.rsplit(": ", 1)[1] for line in lines[-3:]] == ["met", "missed", "missed"]
    # samples count only while it trains: between the first and the last committed iteration
    committed = "\n".join(
        f"2026-01-01 00:00:{sec:02d},000 INFO x: supervisor: iteration {i} committed: 2.0 s"
        for i, sec in ((0, 10), (9, 50))
    )
    t10 = time.mktime(time.strptime("2026-01-01 00:00:10", "%Y-%m-%d %H:%M:%S"))
    timed = [
        {"fds": 3 if t in (0, 60) else 40, "rss_mib": 200.0, "wall": t10 - 10 + t} for t in range(0, 61, 5)
    ]
    lines = soak.report(quiet, log + "\n" + committed, timed)
    assert "supervisor fds: first 40, last 40, max 40 (9 samples)" in lines and lines[-2].endswith(": met")
    lines = soak.report(
        None, log + "\nERROR checkfree.swarm: swarm run failed: iteration 4 failed 5 attempts", []
    )
    assert "iterations given up: 1 (iteration 4)" in lines and all(v.endswith("missed") for v in lines[-3:])


# ------------------------------------------------------------------ live: a source dies mid-fetch


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_replacement_whose_only_source_dies_mid_fetch_serves_without_waiting_for_a_timeout(
    tmp_path,
) -> None:
    """Node 3 (stage 1, replica 1) crashes in iteration 2; its replacement copies the only live replica,
    node 2, which is killed as soon as the replacement joined (a recovery kill). Stage 1 is then lost: the
    replacement is re-planned at once (a copy of stage 2, the single live neighbour under ``ours``) like the
    replacement of node 2, both serve within seconds, alike. Before the fix it asked the dead node until the
    supervisor's ``recovery_timeout`` (90 s here) killed it."""
    cfg = live_config(tmp_path, replicas=2, crash_point=0.3, request_timeout=30, recovery_timeout=90)
    alike: list[bool] = []

    def on_recovered(sup: Supervisor, crashes: list[dict]) -> None:
        stage1 = [s.occupant for s in sup.roster.slots if s.stage == 1]
        a, b = (state_of(sup.fetch_weights(n, 1)) for n in stage1)
        alike.append(all(torch.equal(a[k], b[k]) for k in a))

    sup = Supervisor(
        cfg,
        "ours",
        {3: [2]},
        iterations=5,
        run_dir=tmp_path / "run",
        vocab_size=300,
        on_recovered=on_recovered,
        recovery_kills=[RecoveryKill(2, "source")],
    )
    out = sup.run()
    assert sup.recovery_kills.fired == [
        {"iteration": 2, "kind": "source", "replacement": cfg.first_replacement_id, "killed": [2]}
    ]
    assert out["iterations_completed"] == 5 and alike == [True]
    crashes = {c["slot"]: c for c in out["crashes"]}
    assert set(crashes) == {2, 3}
    for crash in crashes.values():
        assert crash["latency_s"] < 20, crash
        assert (crash["rule"], crash["source_stages"]) == ("copy", [2])
    assert crashes[3]["replacement_node"] == cfg.first_replacement_id  # the first replacement, not a retry


def test_a_storage_node_lost_during_a_rollback_stops_the_run_at_once_with_the_cause(tmp_path) -> None:
    """``checkpoint``: stage 2 is lost and the swarm recovers to roll back; the storage node dies meanwhile and
    its checkpoints with it. The run stops at once naming that cause (before: the replacement asked the new,
    empty storage node until timeouts, and the storage slot's restarts ended it as "failed 5 times"). A
    storage node that serves again starts its count of failed starts afresh."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1, recovery_timeout=5)
    sup = Supervisor(cfg, "checkpoint", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    try:
        for slot in sup.roster.all():
            slot.serving = True
        sup.state.checkpoints.stored = {s: {0, 4} for s in range(cfg.n_stages + 1)}
        sup.state.current = Attempt(7, 6, sup.roster.members(), t_begin=0.0)
        sup.roster.slots[2].serving = False
        storage = sup.roster.storage

        def serve(
            timeout: float, police: bool = True
        ) -> None:  # the storage node dies while the swarm recovers
            sup.processes.mark_dead(storage, "process exited with code -9")

        sup.serve = serve  # type: ignore[method-assign]
        with pytest.raises(SwarmError, match=r"stages \[2\] .* storage node restarted during iteration 6"):
            sup.drive(Recovering(6))
        storage.tries, storage.dead, storage.occupant = 3, False, cfg.storage_id
        sup.roster.by_node[storage.occupant] = storage
        sup.execute(
            sup.peer_messages._on_serving(
                storage, {"stage": -1, "version": 0, "record": {"stage": -1, "rule": "storage"}}
            )
        )
        assert storage.serving and storage.tries == 0
    finally:
        sup.transport.close()


def test_swarm_run_refuses_a_bad_recovery_kill_file_in_one_sentence(tmp_path, capsys) -> None:
    from checkfree.cli import main

    bad = tmp_path / "kills.json"
    bad.write_text(
        '{"format": "checkfree-recovery-kills-v1", "kills": [{"iteration": 2, "kind": "everyone"}]}'
    )
    argv = ["swarm", "run", "--setting", "ours-plus", "--config", "swarm_tiny.json", "--no-schedule"]
    assert main([*argv, "--recovery-kills", str(bad), "--run-dir", str(tmp_path / "run"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "has entry {'iteration': 2, 'kind': 'everyone'}" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_replicas_only_soak_never_takes_a_whole_stage_in_one_iteration() -> None:
    """issue 39's soak "whose deaths always leave each stage a serving replica": single replicas and killed
    replacements only, and one iteration's events kill at most replicas − 1 slots of a stage."""
    soak = _soak()
    for replicas in (2, 3):
        schedule, kills, events = soak.make_schedules(4, replicas, 60, 200, seed=7, replicas_only=True)
        assert {e["kind"] for e in events} == set(soak.REPLICA_KINDS)
        assert sum(e["expected_deaths"] for e in events) >= 200
        for it in {e["iteration"] for e in events}:
            stages = Counter(n // replicas for e in events if e["iteration"] == it for n in e["slots"])
            assert max(stages.values()) <= replicas - 1
    # without the rule the same draws do take whole stages
    _, _, events = soak.make_schedules(4, 2, 60, 200, seed=7)
    assert any(e["kind"] in ("stage", "pair", "stage0") for e in events)


def test_the_useful_work_fraction_is_the_clean_mean_over_the_soak_mean_and_its_verdict_holds_at_the_target() -> (
    None
):
    soak = _soak()
    clean = {"iterations": [{"wall_s": 2.0}, {"wall_s": 4.0}]}  # mean 3
    churned = {"iterations": [{"wall_s": 3.0}, {"wall_s": 5.0}, {"wall_s": 4.0}]}  # mean 4
    assert soak.useful_work_fraction(clean, churned) == pytest.approx(0.75)
    assert soak.reference_lines(clean, churned, 0.75)[-1].endswith(": met")
    assert soak.reference_lines(clean, churned, 0.76)[-1].endswith(": missed")
    assert soak.reference_lines(None, churned, 0.5) == [
        "useful-work fraction: a run did not finish or committed no iteration: missed"
    ]
    assert not soak.reference_lines(clean, churned, None)[-1].endswith(("met", "missed"))


def test_the_reference_run_is_the_soak_command_without_its_schedules(tmp_path: Path, monkeypatch) -> None:
    soak = _soak()
    seen: list[list[str]] = []

    class Run:
        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            seen.append(cmd)
            (tmp_path / "reference").mkdir()
            (tmp_path / "reference" / "throughput.json").write_text('{"iterations": []}')

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(soak.subprocess, "Popen", Run)
    cmd = ["py", "-m", "checkfree", "swarm", "run", "--setting", "ours-plus", "--schedule", "s.json",
           "--recovery-kills", "k.json", "--iterations", "60", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert soak.reference_run(cmd, tmp_path, 10.0) == {"iterations": []}
    assert seen == [["py", "-m", "checkfree", "swarm", "run", "--setting", "ours-plus", "--no-schedule",
                     "--iterations", "60",
                     "--run-dir", str(tmp_path / "reference")]]  # fmt: skip


def test_a_useful_work_target_needs_the_reference_run(tmp_path: Path, capsys) -> None:
    soak = _soak()
    argv = ["--iterations", "6", "--deaths", "4", "--out", str(tmp_path / "soak")]
    assert soak.main([*argv, "--useful-work-target", "0.9"]) == 2
    assert soak.main([*argv, "--reference", "--useful-work-target", "1.5"]) == 2
    assert (
        "--useful-work-target is 1.5; expected a fraction in (0, 1] with --reference."
        in capsys.readouterr().err
    )
    assert not (tmp_path / "soak").exists()
    # the bound itself is a fraction the check accepts (a dry run: schedules written, nothing run)
    assert soak.main([*argv, "--reference", "--useful-work-target", "1", "--dry-run"]) == 0


def test_the_reference_command_is_one_that_swarm_run_accepts(tmp_path: Path, monkeypatch) -> None:
    """The soak's own command, stripped of its schedules, passes swarm run's checks (a --dry-run): a reference
    that named the config's default --rate schedule was refused for a swarm of another size."""
    soak = _soak()
    seen: list[list[str]] = []

    class Run:
        def __init__(self, cmd: list[str], **kwargs: object) -> None:
            seen.append(cmd)

        def wait(self, timeout: float | None = None) -> int:
            return 1

    monkeypatch.setattr(soak.subprocess, "Popen", Run)
    cmd = [sys.executable, "-m", "checkfree", "swarm", "run", "--setting", "ours-plus",
           "--config", str(ROOT / "configs" / "swarm_tiny.json"), "--schedule", "s.json", "--recovery-kills",
           "k.json", "--iterations", "6", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    assert soak.reference_run(cmd, tmp_path, 10.0) is None
    monkeypatch.undo()  # the real Popen for the dry run
    done = subprocess.run([*seen[0], "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
