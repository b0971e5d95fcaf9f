"""The stage-loss probe on a 2-iteration checkpoint: every cell, exact baselines at zero distance, and the
interval arithmetic on hand-made numbers."""

from __future__ import annotations

import json
import math

import pytest
import torch

from checkfree.cli import main
from checkfree.probe.report import fig2_separation, intervals, swap_cost
from checkfree.probe.run import ProbeData, ProbeOptions, run_probe, validate, weight_distance
from checkfree.report.stats import mean_ci

from helpers import VOCAB, RandomBatches, make_trainer, tiny_config

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe")
    cfg = tiny_config(max_iterations=2, eval_interval=2)
    make_trainer(cfg, "no_failure", checkpoint_dir=root / "run" / "checkpoints").train()
    data = ProbeData(
        VOCAB, None, lambda seed: RandomBatches(cfg, seed=seed), [RandomBatches(cfg, 99).batch(0)]
    )
    return root / "run", data


def test_probe_measures_every_cell_and_exact_restores_are_the_floor(checkpoint, tmp_path):
    run, data = checkpoint
    strategies = ["random", "checkfree", "checkpoint", "redundant"]
    opts = ProbeOptions(run, tmp_path / "out", strategies, stages=[2, 3], seeds=2, steps=2)
    result = run_probe(opts, data)
    cells = {(c["stage"], c["strategy"], c["seed"]): c for c in result["cells"]}
    expected = {(None, "no_failure", s) for s in (0, 1)}
    expected |= {(st, name, s) for st in (2, 3) for name in strategies for s in (0, 1)}
    assert set(cells) == expected
    assert all(set(c["losses"]) == {"0", "1", "2"} for c in cells.values())
    for seed in (0, 1):
        ref = cells[(None, "no_failure", seed)]["losses"]
        for exact in ("checkpoint", "redundant"):  # an exact restore then trains exactly like no failure
            cell = cells[(2, exact, seed)]
            assert cell["weight_rel_l2"] == 0.0 and cell["weight_cosine"] == pytest.approx(1.0)
            assert cell["losses"] == ref
        assert cells[(2, "random", seed)]["weight_rel_l2"] > 0.1  # a fresh init is far from the lost stage
        assert cells[(2, "checkfree", seed)]["rule"] == "checkfree"
    # seeds change the data order after the failure: the no-failure curves differ after one step
    assert cells[(None, "no_failure", 0)]["losses"]["1"] != cells[(None, "no_failure", 1)]["losses"]["1"]
    table = intervals(result)
    rnd = [cells[(2, "random", s)]["losses"]["2"] for s in (0, 1)]
    assert table[(2, "random")]["2"] == mean_ci(rnd)
    paired = [
        cells[(2, "random", s)]["losses"]["2"] - cells[(None, "no_failure", s)]["losses"]["2"] for s in (0, 1)
    ]
    assert table[(2, "random")]["minus_no_failure"] == mean_ci(paired)
    out = tmp_path / "out"
    assert json.loads((out / "probe.json").read_text())["cells"] == result["cells"]
    assert "| 2 | random (random) | 2 |" in (out / "probe.md").read_text()
    assert (out / "probe.png").read_bytes()[:4] == b"\x89PNG"
    run_probe(
        ProbeOptions(run, out, ["copy"], stages=[1], seeds=1, steps=1), data
    )  # its own output: replaced


def test_intervals_and_fig2_separation_from_known_numbers():
    def cell(stage, name, seed, loss):
        return {
            "stage": stage,
            "strategy": name,
            "seed": seed,
            "losses": {"0": loss + 1, "5": loss},
            "rule": "",
            "weight_rel_l2": 0.5 if stage else None,
            "weight_cosine": 0.9 if stage else None,
        }

    losses = {
        "no_failure": [1.0, 1.1, 1.2],
        "random": [3.0, 3.1, 3.2],
        "copy": [2.0, 2.1, 2.2],
        "average": [1.95, 2.15, 2.05],
        "checkfree": [1.2, 1.3, 1.4],
    }
    cells = [
        cell(None if n == "no_failure" else 2, n, s, v) for n, vs in losses.items() for s, v in enumerate(vs)
    ]
    result = {"steps": [0, 5], "cells": cells}
    table = intervals(result)
    iv = table[(2, "random")]["5"]
    t_2 = 4.302653  # Student's t, 0.975 quantile, 2 degrees of freedom (to 7 digits)
    assert iv.mean == pytest.approx(3.1) and iv.half_width == pytest.approx(
        t_2 * 0.1 / math.sqrt(3), rel=1e-6
    )
    assert table[(2, "copy")]["minus_no_failure"].mean == pytest.approx(1.0)
    assert table[(2, "copy")]["minus_no_failure"].half_width == pytest.approx(0.0, abs=1e-12)
    (line,) = fig2_separation(result, table)
    assert line == (
        "- stage 2, after 5 steps: random > copy: separated; copy > average: overlapping; "
        "average > checkfree: separated"
    )


def test_weight_distance_by_hand_and_bad_input_through_the_cli(tmp_path, capsys):
    lost = {"w": torch.tensor([3.0, 4.0]), "step": torch.tensor([1])}
    rel, cos = weight_distance({"w": torch.tensor([3.0, 0.0]), "step": torch.tensor([7])}, lost)
    assert rel == pytest.approx(4 / 5) and cos == pytest.approx(9 / 15)  # integer tensors are not weights
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    for argv in (["probe", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")],):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "nowhere" in err[0]


class Killed(Exception):
    pass


def test_a_killed_probe_resumes_from_its_finished_cells(checkpoint, tmp_path, monkeypatch):
    """A probe stopped after 3 cells (a preempted machine) recomputes only the rest when run again, and ends with
    exactly the cells of an uninterrupted probe; other step counts start over."""
    from checkfree.probe import run as probe_mod

    run, data = checkpoint
    opts = ProbeOptions(run, tmp_path / "out", ["random", "copy"], stages=[2], seeds=2, steps=1)
    whole = run_probe(ProbeOptions(run, tmp_path / "whole", opts.strategies, [2], 2, 1), data)
    real_cell, calls, killed = probe_mod._Probe.cell, [], []

    def counted(self, *args):
        if len(calls) == 3 and not killed:
            killed.append(True)
            raise Killed  # the kill, in the middle of the fourth cell
        calls.append(args[:4])
        return real_cell(self, *args)

    monkeypatch.setattr(probe_mod._Probe, "cell", counted)
    with pytest.raises(Killed):
        run_probe(opts, data)
    with open(tmp_path / "out" / "cells.jsonl", "a") as f:
        f.write('{"stage": 2, "strategy": "co')  # a line cut short by the kill is ignored
    first = list(calls)
    resumed = run_probe(opts, data)
    assert len(first) == 3 and len(calls) == 6  # 2 references + 2 × 2 cells = 6, each computed once
    assert set(calls) == {(c["stage"], c["strategy"], c["seed"], c["swaps"]) for c in whole["cells"]}
    assert len(set(calls)) == 6
    assert resumed["cells"] == whole["cells"] and resumed["resumed_cells"] == 3
    calls.clear()
    run_probe(ProbeOptions(run, tmp_path / "out", ["random"], stages=[2], seeds=1, steps=2), data)
    assert len(calls) == 2  # other step counts: nothing reused


def test_swap_strategies_are_paired_with_a_swapped_reference(checkpoint, tmp_path):
    """checkfree_plus trains with swaps after the failure; its damage is measured against no_failure with swaps of
    the same seed, and the swaps' own cost is the swapped reference minus the plain one."""
    run, data = checkpoint
    opts = ProbeOptions(run, tmp_path / "out", ["checkfree", "checkfree_plus"], stages=[2], seeds=2, steps=1)
    result = run_probe(opts, data)
    cells = {(c["stage"], c["strategy"], c["seed"], c["swaps"]): c["losses"]["1"] for c in result["cells"]}
    assert set(cells) == {
        (st, name, s, sw)
        for s in (0, 1)
        for st, name, sw in [
            (None, "no_failure", False),
            (None, "no_failure", True),
            (2, "checkfree", False),
            (2, "checkfree_plus", True),
        ]
    }
    assert (
        cells[(None, "no_failure", 0, True)] != cells[(None, "no_failure", 0, False)]
    )  # swaps change training
    table = intervals(result)
    plus = [cells[(2, "checkfree_plus", s, True)] - cells[(None, "no_failure", s, True)] for s in (0, 1)]
    plain = [cells[(2, "checkfree", s, False)] - cells[(None, "no_failure", s, False)] for s in (0, 1)]
    assert table[(2, "checkfree_plus")]["minus_no_failure"] == mean_ci(plus)
    assert table[(2, "checkfree")]["minus_no_failure"] == mean_ci(plain)
    cost = [cells[(None, "no_failure", s, True)] - cells[(None, "no_failure", s, False)] for s in (0, 1)]
    assert swap_cost(result) == mean_ci(cost)
    md = (tmp_path / "out" / "probe.md").read_text()
    assert "| — | no_failure +swaps | 2 |" in md and "Swaps without a failure" in md


def test_swaps_for_a_base_trained_with_swaps(checkpoint, tmp_path):
    """--swaps: every cell and the one reference train with swaps, so a no-swap rule trains differently; a
    checkpoint with fewer than 4 stages is refused before anything is written."""
    run, data = checkpoint
    plain = run_probe(ProbeOptions(run, tmp_path / "plain", ["random"], [2], 1, 1), data)
    swapped = run_probe(ProbeOptions(run, tmp_path / "swapped", ["random"], [2], 1, 1, swaps=True), data)
    keys = {(c["stage"], c["strategy"], c["swaps"]) for c in swapped["cells"]}
    assert keys == {(None, "no_failure", True), (2, "random", True)}
    loss = {c["stage"]: c["losses"]["1"] for c in swapped["cells"]}
    assert loss[2] != next(c["losses"]["1"] for c in plain["cells"] if c["stage"] == 2)
    assert intervals(swapped)[(2, "random")]["minus_no_failure"].mean == pytest.approx(loss[2] - loss[None])
    three = tiny_config(n_stages=3)
    with pytest.raises(ValueError, match="n_stages ≥ 4"):
        validate(ProbeOptions(run, tmp_path / "x", ["random"], swaps=True), three)
    validate(ProbeOptions(run, tmp_path / "x", ["random"]), three)  # without swaps 3 stages are fine
    assert not (tmp_path / "x").exists()


def test_shards_share_one_probe_and_the_last_writes_the_report(checkpoint, tmp_path, monkeypatch):
    """--shard K/N: two processes into one --out each compute their half of the cells, once; the first to finish
    writes no report, the second writes the report of an unsharded probe; a bad K/N is refused."""
    from checkfree.probe import run as probe_mod

    run, data = checkpoint
    whole = run_probe(ProbeOptions(run, tmp_path / "whole", ["random", "copy"], [2], 2, 1), data)
    real_cell, calls = probe_mod._Probe.cell, []

    def counted(self, *args):
        calls.append(args[:4])
        return real_cell(self, *args)

    monkeypatch.setattr(probe_mod._Probe, "cell", counted)
    shard = [ProbeOptions(run, tmp_path / "out", ["random", "copy"], [2], 2, 1, shard=(k, 2)) for k in (1, 2)]
    first = run_probe(shard[0], data)
    assert first["complete"] is False and (first["computed"], first["finished"], first["total"]) == (3, 3, 6)
    assert not (tmp_path / "out" / "probe.json").exists()
    last = run_probe(shard[1], data)
    assert len(calls) == 6 and len(set(calls)) == 6  # every cell once, split between the shards
    assert last["cells"] == whole["cells"] and last["resumed_cells"] == 3
    assert json.loads((tmp_path / "out" / "probe.json").read_text())["cells"] == whole["cells"]
    with pytest.raises(ValueError, match="--shard 3/2"):
        run_probe(ProbeOptions(run, tmp_path / "bad", ["random"], [2], 1, 1, shard=(3, 2)), data)
    assert not (tmp_path / "bad").exists()


def test_the_output_lock_excludes_a_second_holder(tmp_path):
    """Only one probe at a time claims an output directory; a second waits, then gives up with TimeoutError."""
    from checkfree.probe.run import locked

    with locked(tmp_path):
        with pytest.raises(TimeoutError, match="locked by another probe"):
            with locked(tmp_path, timeout_s=0.2):
                pass
    with locked(tmp_path, timeout_s=0.2):  # released when the first holder leaves
        pass
