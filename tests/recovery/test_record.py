"""The one recovery record: every schema key always written, a round trip through JSON, and the one legacy mapping
that reads the records archived before it."""

import json

import pytest

from checkfree.recovery.record import SCHEMA_KEYS, RecoveryRecord, upgrade


def test_to_json_writes_every_schema_key_in_order_then_the_producers_fields():
    rec = RecoveryRecord(2, "checkfree", "checkfree", [1, 3], weights=[0.25, 0.75], extra={"loss_spike": 0.1})
    rec.iteration, rec.latency_s = 7, 0.5
    data = rec.to_json()
    assert list(data) == [*SCHEMA_KEYS, "loss_spike"]
    assert data["source_stages"] == [1, 3] and data["source_nodes"] is None and data["latency_s"] == 0.5
    assert RecoveryRecord.from_json(json.loads(json.dumps(data))) == rec


def test_an_extra_field_may_not_shadow_a_schema_field():
    with pytest.raises(ValueError, match=r"\['latency_s'\] are schema fields"):
        RecoveryRecord(1, "copy", extra={"latency_s": 3.0}).to_json()


@pytest.mark.parametrize(
    "bad", [[], {"stage": 1}, {"stage": "1", "rule": "copy"}, {"stage": True, "rule": "x"}]
)
def test_from_json_refuses_a_record_without_stage_and_rule(bad):
    with pytest.raises(ValueError, match="a recovery record needs"):
        RecoveryRecord.from_json(bad)


def test_a_simulator_line_of_before_the_schema_reads_as_the_schema():
    old = {"kind": "recovery", "iteration": 25, "stage": 3, "strategy": "checkfree", "rule": "checkfree"}
    old |= {
        "sources": [2, 4],
        "weights": [0.55, 0.45],
        "seconds": 0.013,
        "omega": [0.08, 0.065],
        "loss_spike": 0.1,
    }
    new = upgrade(old, "simulator")
    assert (new["source_stages"], new["latency_s"], new["omegas"]) == ([2, 4], 0.013, [0.08, 0.065])
    assert new["source_nodes"] is None and new["loss_spike"] == 0.1
    assert not {"sources", "seconds", "omega"} & set(new) and set(SCHEMA_KEYS) <= set(new)


def test_a_swarm_crash_row_of_before_the_schema_names_its_nodes_and_stages_apart():
    old = {
        "node": 4,
        "stage": 2,
        "rule": "checkfree",
        "sources": [7, 9],
        "source_stages": [1, 3],
        "latency_s": 6.0,
    }
    new = upgrade(old, "swarm")
    assert (new["source_nodes"], new["source_stages"], new["latency_s"]) == ([7, 9], [1, 3], 6.0)
    assert "sources" not in new


def test_a_record_of_the_schema_reads_unchanged():
    rec = RecoveryRecord(2, "copy", source_stages=[1], source_nodes=[5], latency_s=1.5, iteration=3).to_json()
    assert upgrade(rec, "swarm") == rec and upgrade(rec, "simulator") == rec


def test_a_row_with_a_key_under_its_old_and_new_name_keeps_the_new_one_in_either_order() -> None:
    for row in (
        {"stage": 2, "rule": "copy", "source_nodes": [5], "sources": [9]},  # the old key after the new
        {"stage": 2, "rule": "copy", "sources": [9], "source_nodes": [5]},  # and before it
    ):
        assert upgrade(row, "swarm")["source_nodes"] == [5] and "sources" not in upgrade(row, "swarm")
    sim = {"stage": 3, "rule": "checkfree", "latency_s": 0.5, "seconds": 9.0, "omegas": [1.0], "omega": [7.0]}
    new = upgrade(sim, "simulator")
    assert (new["latency_s"], new["omegas"]) == (0.5, [1.0]) and not {"seconds", "omega"} & set(new)
