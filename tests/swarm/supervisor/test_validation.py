"""The supervisor's side of a validation (checkfree.swarm.supervisor.validation): when one is due, whom it asks, which
answers it takes, and the validation loss it records: the simulator's mean over every batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Roster, SupervisorState
from checkfree.swarm.supervisor.validation import ValidationRuns
from checkfree.swarm.wire.protocol import ProtocolError

from helpers.swarm import live_config


class Commands(list):
    """A link that records (node, command, fields)."""

    def command(self, to: int, command: str, **meta: object) -> None:
        self.append((to, command, meta))


def runs(
    tmp_path: Path, replicas: int = 2, validation: int = 5, **cfg: object
) -> tuple[ValidationRuns, Commands]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = live_config(
        tmp_path, replicas=replicas, model={"validation": validation, "eval_interval": 50}, **cfg
    )
    roster = Roster(config, 0, config.n_nodes, storage=False)
    for slot in roster.slots:
        slot.serving = True
    link = Commands()
    return ValidationRuns(
        SupervisorState(config, "ours", 300, None, roster), link, ModelRecords(), lambda: 1.0
    ), link


def test_a_validation_is_due_at_zero_every_interval_and_at_the_end_once_per_commit(tmp_path: Path) -> None:
    v, _ = runs(tmp_path, eval_interval=3)
    state = v.state
    due = []
    for commits in range(8):  # the loop evaluates after each commit that makes one due (target 7)
        state.commits = commits
        if v.due(commits, 7):
            due.append(commits)
            v.commits = commits  # begun
    assert due == [0, 3, 6, 7]  # the simulator's: iteration 0, multiples of eval_interval, the end
    assert not v.due(6, 7) and not v.due_at_end()  # evaluated at these commits already
    state.commits = 8
    assert v.due_at_end()  # a run that ends before its target evaluates its last weights
    default, _ = runs(tmp_path / "d")
    assert default.interval == 50  # no eval_interval in the swarm config: the model config's
    off, _ = runs(tmp_path / "o", eval_interval=0)
    assert not off.due(0, 7) and not off.due_at_end()


def test_evaluate_goes_to_every_serving_node_and_each_stage0_node_takes_its_share(tmp_path: Path) -> None:
    v, link = runs(tmp_path, replicas=2, validation=5)
    v.state.attempt, v.state.iteration = 7, 4
    assert v.begin()
    assert sorted(n for n, _, _ in link) == list(range(8)) and {c for _, c, _ in link} == {"evaluate"}
    fields = link[0][2]
    assert fields["evaluation"] == 7 and fields["iteration"] == 4 and fields["members"]["0"] == [0, 1]
    assert (v.share(0), v.share(1)) == (3, 2)  # batches 0, 2, 4 and 1, 3
    assert not v.begin()  # one evaluation per attempt number: nodes order them by it
    slot0, slot1, slot2 = v.state.roster.slots[:3]
    with pytest.raises(ProtocolError, match="not the one in progress"):
        v.on_evaluated(slot0, {"evaluation": 6, "loss_sum": 1.0, "batches": 3})
    with pytest.raises(ProtocolError, match="share is 3"):
        v.on_evaluated(slot0, {"evaluation": 7, "loss_sum": 1.0, "batches": 2})
    with pytest.raises(ProtocolError, match="no stage-0 member"):
        v.on_evaluated(slot2, {"evaluation": 7, "loss_sum": 1.0, "batches": 0})
    v.on_evaluated(slot0, {"evaluation": 7, "loss_sum": 3 * 5.0, "batches": 3})
    with pytest.raises(ProtocolError, match="no stage-0 member"):  # a second report
        v.on_evaluated(slot0, {"evaluation": 7, "loss_sum": 3 * 5.0, "batches": 3})
    assert not v.complete()
    v.on_evaluated(slot1, {"evaluation": 7, "loss_sum": 2 * 6.0, "batches": 2})
    assert v.complete()
    record = v.finish()
    # the mean over every batch (27 / 5), not the mean of the two nodes' means (5.5)
    assert record["val_loss"] == pytest.approx(27 / 5) and record["perplexity"] == pytest.approx(
        math.exp(27 / 5)
    )
    assert record["iteration"] == 4 and record["batches"] == 5 and v.records.validation == [record]
    assert v.on_evaluated(slot1, {"evaluation": 7, "loss_sum": 1.0, "batches": 2}) == []  # late: ignored


def test_the_validation_loss_adds_the_stage0_sums_in_pipeline_order_not_arrival_order(tmp_path: Path) -> None:
    """Two runs whose ``evaluated`` reports come in other orders record the same bits (issue 39)."""
    sums = [1e16, 1.0, -1e16]  # float addition is not associative: the order shows in the result
    records = []
    for arrival in ([2, 0, 1], [0, 1, 2]):
        v, _ = runs(tmp_path / str(arrival[0]), replicas=3, validation=5)
        v.state.attempt, v.state.iteration = 1, 0
        assert v.begin()
        for p in arrival:
            slot = v.state.roster.slots[p]  # stage-0 node of pipeline p
            v.on_evaluated(slot, {"evaluation": 1, "loss_sum": sums[p], "batches": v.share(slot.occupant)})
        records.append(v.finish()["val_loss"])
    in_pipeline_order = (sums[0] + sums[1] + sums[2]) / 5
    assert records == [in_pipeline_order, in_pipeline_order]
    assert (sums[2] + sums[0] + sums[1]) / 5 != in_pipeline_order  # the first arrival order's sum differs


def test_a_validation_with_a_lost_stage_or_a_diverged_loss_records_why(tmp_path: Path) -> None:
    v, link = runs(tmp_path, replicas=1, validation=2)
    v.state.roster.slots[2].serving = False
    assert not v.begin() and link == []
    assert v.records.validation_given_up[0]["why"] == "stages [2] have no serving replica"
    v.state.roster.slots[2].serving = True
    v.state.attempt = 1
    assert v.begin()
    v.on_evaluated(
        v.state.roster.slots[0], {"evaluation": 1, "loss_sum": 0.0, "batches": 2, "diverged": True}
    )
    assert math.isnan(v.finish()["val_loss"])
