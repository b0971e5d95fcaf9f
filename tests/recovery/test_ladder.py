"""The exactness ladder: each rung is picked when it is the most exact one available, in the simulator."""

from __future__ import annotations

import pytest
import torch

from checkfree.config import ConfigError, config_from_dict, parse_ladder_rungs
from checkfree.recovery.stage_copy import flatten

from helpers import ScriptedFailures, full_state, make_trainer, same_tensors, tiny_config

pytestmark = pytest.mark.timeout(120)


def trainer(rungs: str, script: dict[int, list[int]], **cfg_kw):
    cfg = tiny_config(max_iterations=10, snapshot_every=4, ladder_rungs=rungs, **cfg_kw)
    t = make_trainer(cfg, "ladder", ScriptedFailures(script), swaps=True)
    t.strategy.setup(t.state)
    return t


def fail_at(t, iteration: int) -> dict[int, dict]:
    """Train up to ``iteration``, then lose its scripted stages; the recovery records by stage."""
    records = []
    t.ctx.sink.write = lambda kind, **kw: records.append({"kind": kind, **kw})
    while t.state.iteration < iteration:
        t.step()
    failed = t.failures.draw(iteration)
    t.strategy.begin_iteration(t.state, failed)
    t.lose_stages(failed)
    return {r["stage"]: r for r in records if r["kind"] == "recovery"}


def test_redundant_rung_restores_the_replica_exactly():
    t = trainer("redundant,random", {3: [2]})
    recs = fail_at(t, 3)
    before = full_state(t, [2])
    assert recs[2]["rung"] == "redundant" and recs[2]["rule"] == "replica" and recs[2]["source_stages"] == [1]
    t2 = trainer("redundant,random", {})
    fail_at(t2, 3)
    assert same_tensors(before, full_state(t2, [2]))  # bit-identical to the run where nothing failed


def test_ec_rung_decodes_a_single_loss_to_its_snapshot():
    t = trainer("ec_snapshot,random", {6: [3]})
    while t.state.iteration < 4:
        t.step()
    snapshot = flatten(t.state, 3).clone()  # the round at iteration 4 takes exactly this
    recs = fail_at(t, 6)
    assert recs[3]["rung"] == "ec_snapshot" and recs[3]["rule"] == "ec_decode"
    assert recs[3]["stale_iterations"] == 2
    assert torch.equal(flatten(t.state, 3), snapshot)


def test_stale_snapshot_and_double_loss_step_down_to_the_neighbour_rule():
    t = trainer("ec_snapshot,neighbour,random", {6: [3]}, ladder_max_stale=1)
    assert fail_at(t, 6)[3]["rung"] == "neighbour"  # 2 iterations old > 1
    t = trainer("ec_snapshot,neighbour,random", {6: [2, 3]})
    recs = fail_at(t, 6)  # one parity block decodes one loss
    assert [recs[s]["rung"] for s in (2, 3)] == ["neighbour", "neighbour"]
    assert recs[2]["source_stages"] == [1, 4] and recs[2]["rule"] == "checkfree"


def test_neighbour_rung_rebuilds_from_stages_restored_exactly():
    t = trainer("redundant,ec_snapshot,neighbour,random", {3: [2, 3]})
    recs = fail_at(t, 3)
    assert recs[2]["rung"] == "redundant"  # its holder, stage 1, survived
    assert recs[3]["rung"] == "neighbour"  # its holder, stage 2, died with it
    # stage 2 counts as alive again
    assert recs[3]["rule"] == "checkfree" and recs[3]["source_stages"] == [2, 4]
    assert t.state.lr_multipliers[3] == pytest.approx(1.1) and t.state.lr_multipliers[2] == 1.0


def test_random_rung_alone_and_stage0_by_each_rung():
    t = trainer("random", {2: [1]})
    assert fail_at(t, 2)[1]["rung"] == "random"
    assert fail_at(trainer("ec_snapshot,neighbour,random", {2: [0]}), 2)[0]["rung"] == "neighbour"
    assert fail_at(trainer("redundant,neighbour", {2: [0]}), 2)[0]["rung"] == "redundant"
    assert fail_at(trainer("random", {2: [0]}), 2)[0]["rung"] == "random"
    t = trainer("neighbour", {2: [1, 2, 3, 4]})  # no live transformer stage: the neighbour rule cannot apply
    assert {r["rung"] for r in fail_at(t, 2).values()} == {"random"}


def test_rungs_are_validated_and_costs_add_up():
    assert parse_ladder_rungs("random, redundant") == ("redundant", "random")
    for bad in ("redundant,ec_snapshot", "neighbour,neighbour", "replica,random", ""):
        with pytest.raises(ValueError):
            parse_ladder_rungs(bad)
    with pytest.raises(ConfigError, match="ladder_rungs 'bogus'"):
        config_from_dict({**tiny_config().to_json(), "ladder_rungs": "bogus"})
    t = trainer("redundant,ec_snapshot,neighbour,random", {3: [2]})
    fail_at(t, 3)
    stats = t.strategy.stats()
    parts = t.strategy.redundant.stats(), t.strategy.ec.stats(), t.strategy.neighbour.stats()
    assert stats["extra_memory_bytes"] == sum(p["extra_memory_bytes"] for p in parts)
    assert stats["rungs_used"] == {"redundant": 1}
