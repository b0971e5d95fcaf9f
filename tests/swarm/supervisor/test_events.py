"""The events :class:`~checkfree.swarm.supervisor.results.Results` and
:class:`~checkfree.swarm.supervisor.state.Slot` are told (issue 38): each writes what throughput.json and the
journal held when the supervisor wrote the fields itself, and a journaled Results reads back the same."""

from __future__ import annotations

import json
from pathlib import Path

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import load_swarm_config
from checkfree.swarm.supervisor.journal import decode_results, encode_results
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.state import Slot


def _results() -> Results:
    cfg = load_swarm_config("swarm_tiny.json")
    return Results(cfg, "ours", 3, vocab_size=96, schedule={"path": "s.json", "format": "f"})


def _told(results: Results) -> None:
    """One of every run event."""
    slot = Slot(2, 1, "a", True)
    results.start()
    results.skipped_crash(slot, 4)
    results.rolled_back(7, 5, {2, 1}, 1000)
    results.rolled_back(9, 8, {3}, 24)
    results.evicted(11, slot, 6, "forged gradients", 2, {3: 1, 1: 4}, True)
    results.evicted(12, None, 6, "spam", 0, {}, False)
    results.machine_revoked({"machine": 4, "slots_moved": [4, 5]})
    results.resumed(1, results.started_at + 2.5, 3.0, 6, 6, None, [3, 1], {5: "dead"}, 2)
    results.next_commit_after_resume()
    results.resumed(2, results.started_at + 4.0, 5.0, 8, None, 8, [1], {}, 0)
    results.next_commit_after_resume()  # the second resume rolled its commit forward: t_next_commit is set
    results.ended_by_schedule()
    results.away_at_end([3, 0])
    results.final_reports({1: {"sent_bytes": {}}})
    results.refused_connections(5)
    results.journal_cost(4, 0.5, 2048)


def test_each_event_is_recorded_as_throughput_json_has_it(tmp_path: Path) -> None:
    results = _results()
    _told(results)
    out = json.loads(json.dumps(results.finish(tmp_path)))
    assert out == json.loads((tmp_path / "throughput.json").read_text())
    assert out["skipped_crashes"] == [{"slot": 2, "stage": 1, "iteration": 4}]
    assert [{k: v for k, v in r.items() if k != "t"} for r in out["rollbacks"]] == [
        {"at_iteration": 7, "to_iteration": 5, "lost_stages": [1, 2]},
        {"at_iteration": 9, "to_iteration": 8, "lost_stages": [3]},
    ]
    assert out["rollback_bytes"] == 1024
    first = {k: v for k, v in out["evictions"][0].items() if k != "t"}
    assert first == {
        "node": 11,
        "slot": 2,
        "stage": 1,
        "iteration": 6,
        "cause": "forged gradients",
        "rejected_by_supervisor": 2,
        "reported_by": {"1": 4, "3": 1},
        "replaced": True,
    }
    assert (out["evictions"][1]["slot"], out["evictions"][1]["stage"]) == (None, None)
    assert out["machine_revocations"] == [{"machine": 4, "slots_moved": [4, 5]}]
    one, two = out["coordinator_outages"]
    assert list(one) == [
        "resume",
        "t_lost",
        "t_resumed",
        "t_adopted",
        "t_next_commit",
        "from_iteration",
        "iterations_redone",
        "rolled_forward",
        "adopted",
        "replaced",
        "stale_messages_dropped",
    ]
    assert (one["resume"], one["t_lost"], one["t_resumed"], one["from_iteration"]) == (1, 2.5, 3.0, 6)
    assert (one["adopted"], one["replaced"], one["stale_messages_dropped"]) == ([1, 3], {"5": "dead"}, 2)
    assert one["t_next_commit"] is not None and one["t_next_commit"] >= one["t_adopted"]
    assert two["t_next_commit"] == two["t_adopted"] and two["rolled_forward"] == 8
    assert out["resumes"] == 2
    assert (out["ended_by"], out["still_away"], out["vocab_size"]) == ("schedule", [3, 0], 96)
    assert out["schedule"] == {"path": "s.json", "format": "f"}
    assert out["refused_connections"] == {"supervisor": 5}
    assert out["journal"] == {"writes": 4, "seconds": 0.5, "bytes": 2048}


def test_a_commit_after_a_resume_sets_its_next_commit_once() -> None:
    results = _results()
    results.start()
    results.resumed(1, 0.0, 1.0, 2, 2, None, [], {}, 0)
    results.next_commit_after_resume()
    first = results.outages[-1]["t_next_commit"]
    results.next_commit_after_resume()
    assert first is not None and results.outages[-1]["t_next_commit"] == first


def test_the_journal_gives_back_every_event(tmp_path: Path) -> None:
    results = _results()
    _told(results)
    back = _results()
    decode_results(back, json.loads(json.dumps(encode_results(results))))
    old, new = results.finish(tmp_path / "a"), back.finish(tmp_path / "b")
    assert {k: v for k, v in new.items() if k != "total_s"} == {
        k: v for k, v in old.items() if k != "total_s"
    }
    assert back.finals == results.finals and back.started_at == results.started_at


def test_the_journal_names_the_fields_as_before() -> None:
    """A resume reads journals that earlier versions wrote: the fields keep their names (no leading
    underscore), the open crashes stay ``_open``, the config and the clock are not fields."""
    names = set(encode_results(_results()))
    assert {"rows", "crashes", "_open", "aborts", "redone", "outages", "finals", "node_devices"} <= names
    assert {"elapsed_s", "written_wall"} <= names
    assert not {"cfg", "t0", "_rows", "_cfg", "_t0", "open"} & names


def test_a_slot_started_again_forgets_its_occupants_state() -> None:
    slot = Slot(3, 1, "a", True)
    assert slot.start_counted() == 1
    slot.started(3, 10.0)
    slot.joined("tcp://x:1")
    plan = RecoveryPlan("copy", (1,))
    assert slot.planned(plan) is True and slot.planned(RecoveryPlan("copy", (1,))) is False
    assert slot.plan_sent() == 1 and slot.plan_sent() == 2
    slot.replan_answered()
    slot.version_reported(copy_version=4)
    assert slot.serves(7, ("copy", [1], 1, None), storage=False) is False
    assert (slot.serving, slot.version, slot.deadline, slot.tries) == (True, 7, float("inf"), 1)
    slot.died()
    assert (slot.dead, slot.serving, slot.restarted) == (True, False, True)
    assert slot.start_counted() == 2
    slot.started(40, 20.0)
    fresh = Slot(3, 1, "a", True).to_json()  # nothing sent to, joined by or held by the new occupant
    assert slot.to_json() == fresh | {
        "occupant": 40,
        "version": 7,
        "tries": 2,
        "restarted": True,
        "plan": plan.to_json(),
        "consecutive": False,
    }
    assert slot.deadline == 20.0
    assert slot.serves(8, None, storage=True) is True  # it replaced one that died
    assert (slot.restarted, slot.tries) == (False, 0)  # a storage node's starts stop counting


def test_slot_events_as_the_schedule_and_the_planner_tell_them() -> None:
    slot = Slot(5, 2, "b", False)
    slot.kept_away(12)
    assert (slot.away, slot.back_at) == (True, 12)
    slot.came_back()
    assert (slot.away, slot.back_at) == (False, None)
    slot.lost_in(consecutive=True)
    slot.hosted_by(9)
    assert (slot.consecutive, slot.launcher, slot.local) == (True, 9, False)
    slot.moved_here()
    assert (slot.launcher, slot.local) == (None, True)
    slot.version_reported(version=3)
    assert (slot.version, slot.copy_version) == (3, None)
    slot.start_counted()
    slot.starts_forgiven()
    slot.awaited_until(5.0)
    assert (slot.tries, slot.deadline) == (0, 5.0)


def test_a_restored_results_keeps_the_node_devices_it_shares_with_the_host() -> None:
    """The host fills ``node_devices`` as it starts nodes, into the dict Results was given: a resume's journal
    joins that dict instead of replacing it, so the replacements started after a resume reach throughput.json."""
    journaled = _results()
    journaled.node_devices.update({0: "cuda:0", 1: "cpu"})
    held: dict[int, str] = {}
    back = Results(load_swarm_config("swarm_tiny.json"), "ours", 3, node_devices=held)
    decode_results(back, json.loads(json.dumps(encode_results(journaled))))
    held[7] = "cuda:1"  # a replacement the resumed host starts
    assert back.node_devices is held and back.node_devices == {0: "cuda:0", 1: "cpu", 7: "cuda:1"}
