"""Baselines that keep state: checkpoint/one (sync, async, memory), redundant (Bamboo), ec_snapshot (REFT)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from checkfree.checkpoint import store
from checkfree.recovery.checkpoint import paper_interval
from checkfree.recovery.ec_snapshot import decode_lost, encode_parity
from checkfree.recovery.registry import REGISTRY, resolve_setting
from checkfree.recovery.stage_copy import flatten
from checkfree.telemetry.metrics import MetricsSink, read_metrics

from helpers import ScriptedFailures, full_state, make_trainer, same_tensors, tiny_config

pytestmark = pytest.mark.timeout(120)


def run(setting, script, tmp_path, **cfg_kw):
    cfg = tiny_config(**{"max_iterations": 10, "checkpoint_every": 4, "snapshot_every": 4, **cfg_kw})
    tmp_path.mkdir(parents=True, exist_ok=True)
    sink = MetricsSink(tmp_path / f"{setting}.jsonl")
    t = make_trainer(cfg, setting, ScriptedFailures(script), sink=sink, checkpoint_dir=tmp_path / setting)
    summary = t.train()
    sink.close()
    return t, summary, read_metrics(tmp_path / f"{setting}.jsonl")


def test_registry_names_aliases_and_stage0():
    assert {"checkpoint", "one", "redundant", "ec_snapshot"} <= set(REGISTRY)
    assert resolve_setting("whole_model", swaps=False) == "checkpoint"
    assert REGISTRY["checkpoint"].recovers_stage0 and REGISTRY["one"].recovers_stage0
    assert REGISTRY["redundant"].recovers_stage0 and not REGISTRY["ec_snapshot"].recovers_stage0


def test_paper_checkpoint_interval_by_model_size():
    assert [paper_interval(n) for n in (124e6, 500e6, 1.5e9)] == [50, 100, 40]


SLOW_WRITE = 0.2
"""Seconds every checkpoint write is slowed by in the stall tests (a slow disk)."""


def slow_disk(monkeypatch) -> list[float]:
    """Slow every checkpoint write by SLOW_WRITE s; returns the list that the durations of the strategy's writes
    (not the run's final resume checkpoint) are appended to."""
    real, durations = store.write_snapshot, []

    def write(snapshot, root, *a, **kw):
        t0 = time.perf_counter()
        time.sleep(SLOW_WRITE)
        try:
            return real(snapshot, root, *a, **kw)
        finally:
            if root.name == "strategy":
                durations.append(time.perf_counter() - t0)

    monkeypatch.setattr(store, "write_snapshot", write)
    return durations


@pytest.mark.parametrize("mode", ["sync", "async", "memory"])
def test_rollback_is_bit_exact_and_redoes_the_lost_iterations(tmp_path, mode, monkeypatch):
    """After rollbacks the run ends bit-identical to a run without failures: weights, Adam state and data
    position all came back exactly. The wall clock keeps counting; each rollback line says what was lost.
    The stall is what the user waits for: sync waits for every write, async for none of its own, memory writes
    no file."""
    ref, _, _ = run("no_failure", {}, tmp_path / "ref")
    writes = slow_disk(monkeypatch)
    t, summary, recs = run("checkpoint", {2: [3], 6: [1, 4]}, tmp_path, save_mode=mode)
    assert same_tensors(full_state(t), full_state(ref))
    rollbacks = [r for r in recs if r["kind"] == "rollback"]
    assert [
        (r["iteration"], r["from_effective_iteration"], r["to_effective_iteration"], r["iterations_lost"])
        for r in rollbacks
    ] == [(2, 2, 0, 2), (6, 4, 4, 0)]  # before the first K: back to iteration 0
    assert summary["iterations"] == 12 and summary["effective_iterations"] == 10
    assert summary["strategy_stats"]["iterations_lost"] == 2
    trains = [(r["iteration"], r["effective_iteration"]) for r in recs if r["kind"] == "train"]
    assert trains[:4] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    saves = [r for r in recs if r["kind"] == "checkpoint" and r["purpose"] == "strategy"]
    assert [r["effective_iteration"] for r in saves] == [0, 4, 8]
    assert all(r["mode"] == mode and r["bytes"] > 0 for r in saves)
    assert all((r["path"] is None) == (mode == "memory") for r in saves)
    rounding = 2e-6  # the records keep 6 decimals
    if mode == "sync":  # the training thread waited for each whole write
        assert len(writes) == len(saves)
        assert all(r["stall_seconds"] >= w - rounding for r, w in zip(saves, writes, strict=True))
    elif mode == "async":  # each write ran after the stall ended and before the save was committed
        assert len(writes) == len(saves)
        assert all(r["seconds"] - r["stall_seconds"] >= SLOW_WRITE - rounding for r in saves)
    else:
        assert writes == [] and not (tmp_path / "checkpoint" / "strategy").exists()


def test_rollback_restores_the_checkpoint_state_and_rng(tmp_path):
    cfg = tiny_config(max_iterations=10, checkpoint_every=3, save_mode="memory")
    t = make_trainer(cfg, "checkpoint", ScriptedFailures({5: [2]}))
    t.strategy.setup(t.state)
    for _ in range(3):
        t.step()
    at_checkpoint, rng = full_state(t), torch.get_rng_state()
    t.step(), t.step()
    torch.manual_seed(1234)  # disturb the global generator; the rollback must put it back
    failed = t.failures.draw(5)
    t.strategy.begin_iteration(t.state, failed)
    t.lose_stages(failed)
    assert same_tensors(full_state(t), at_checkpoint)
    assert torch.equal(torch.get_rng_state(), rng)
    assert (t.state.iteration, t.state.effective_iteration) == (5, 3)


def test_one_restores_only_the_failed_stage(tmp_path):
    cfg = tiny_config(max_iterations=10, checkpoint_every=4, save_mode="sync")
    t = make_trainer(cfg, "one", ScriptedFailures({6: [2]}), checkpoint_dir=tmp_path)
    t.strategy.setup(t.state)
    for _ in range(4):
        t.step()
    stage2_at_4 = full_state(t, [2])
    t.step(), t.step()
    others = full_state(t, [0, 1, 3, 4])
    failed = t.failures.draw(6)
    t.strategy.begin_iteration(t.state, failed)
    t.lose_stages(failed)
    assert same_tensors(full_state(t, [2]), stage2_at_4)
    assert same_tensors(full_state(t, [0, 1, 3, 4]), others)
    assert t.state.effective_iteration == 6


def test_async_snapshot_never_sees_a_half_updated_state(tmp_path, monkeypatch):
    """A copy slowed past the whole forward/backward still holds the iteration-start state, and at most one
    flush is ever in flight."""
    real_materialize, real_write = store.materialize, store.write_snapshot
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def slow_materialize(snap):
        time.sleep(0.3)
        return real_materialize(snap)

    def slow_write(*a, **kw):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.5)
        try:
            return real_write(*a, **kw)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(store, "materialize", slow_materialize)
    monkeypatch.setattr(store, "write_snapshot", slow_write)
    cfg = tiny_config(max_iterations=6, checkpoint_every=1, save_mode="async")
    t = make_trainer(cfg, "checkpoint", checkpoint_dir=tmp_path)
    t.strategy.setup(t.state)
    t.step(), t.step()
    start_of_2 = full_state(t)
    t.step()
    t.strategy.finish(t.state)
    snap = store.read_checkpoint(tmp_path / "strategy" / "iter_0000002")
    probe = make_trainer(cfg, "no_failure", seed=9)
    store.restore(snap, probe.state, 1)
    assert same_tensors(full_state(probe), start_of_2)
    assert most[0] == 1


def test_disk_modes_without_a_run_directory_use_a_temporary_one():
    t = make_trainer(
        tiny_config(save_mode="sync", max_iterations=4), "checkpoint", ScriptedFailures({3: [1]})
    )
    t.train()
    root = t.strategy.writer.root
    assert t.strategy.stats()["iterations_lost"] == 3 and not root.exists()


def test_redundant_restores_the_pre_failure_state_exactly(tmp_path):
    cfg = tiny_config(max_iterations=10, redundant_measure_every=2)
    t = make_trainer(cfg, "redundant", ScriptedFailures({3: [0, 2]}))
    t.strategy.setup(t.state)
    for _ in range(3):
        t.step()
    before = full_state(t)
    failed = t.failures.draw(3)
    t.lose_stages(failed)
    assert same_tensors(full_state(t), before)  # stage 0 from stage 4's replica, stage 2 from stage 1's
    stats = t.strategy.stats()
    expected = sum(t.numel() * t.element_size() for t in full_state(t))
    assert stats["extra_memory_bytes"] == expected
    assert stats["redundant_forward_seconds_per_microbatch"] > 0


def test_redundant_run_equals_no_failure_and_two_consecutive_losses_fall_back(tmp_path):
    ref, _, _ = run("no_failure", {}, tmp_path / "ref")
    t, summary, _ = run("redundant", {2: [1], 5: [3]}, tmp_path)
    assert same_tensors(full_state(t), full_state(ref))
    assert summary["fallbacks"] == 0
    _, summary, recs = run("redundant", {4: [2, 3]}, tmp_path / "pair")
    by_stage = {r["stage"]: r for r in recs if r["kind"] == "recovery"}
    assert by_stage[2]["rule"] == "replica" and by_stage[2]["fallback"] is None
    assert by_stage[3]["rule"] == "checkfree" and by_stage[3]["source_stages"] == [2, 4]
    assert "predecessor 2" in by_stage[3]["fallback"] and summary["fallbacks"] == 1


def test_parity_decodes_any_float_bits_exactly():
    g = torch.Generator().manual_seed(0)
    vecs = [
        torch.randn(1000, generator=g) * 10 ** torch.randint(-30, 30, (1000,), generator=g) for _ in range(4)
    ]
    vecs[1][:3] = torch.tensor([float("nan"), -0.0, float("inf")])
    parity = encode_parity(vecs)
    for lost in range(4):
        got = decode_lost(parity, [v for i, v in enumerate(vecs) if i != lost])
        assert torch.equal(got.view(torch.int32), vecs[lost].view(torch.int32))


def test_ec_snapshot_decodes_the_lost_stage_to_its_snapshot_and_leaves_the_others(tmp_path):
    cfg = tiny_config(max_iterations=10, snapshot_every=4)
    t = make_trainer(cfg, "ec_snapshot", ScriptedFailures({6: [3]}))
    t.strategy.setup(t.state)
    for _ in range(4):
        t.step()
    stage3_at_4 = full_state(t, [3])
    lr3 = t.state.lr_multipliers[3]
    t.step(), t.step()
    others = full_state(t, [0, 1, 2, 4])
    failed = t.failures.draw(6)
    t.strategy.begin_iteration(t.state, failed)
    t.lose_stages(failed)
    assert same_tensors(full_state(t, [3]), stage3_at_4)
    assert same_tensors(full_state(t, [0, 1, 2, 4]), others)
    assert t.state.lr_multipliers[3] == lr3 and t.state.effective_iteration == 6
    assert torch.equal(t.strategy.snapshots[3], flatten(t.state, 3))  # the code is complete again


def test_ec_snapshot_two_losses_fall_back_and_costs_are_recorded(tmp_path):
    t, summary, recs = run("ec_snapshot", {5: [2, 3]}, tmp_path)
    rec = [r for r in recs if r["kind"] == "recovery"]
    assert [r["rule"] for r in rec] == ["checkfree", "checkfree"]
    assert all("2 stages lost at once" in r["fallback"] for r in rec)
    snaps = [r for r in recs if r["kind"] == "snapshot"]
    assert [r["iteration"] for r in snaps] == [0, 4, 5, 8]  # 5: a new round after the fallback
    vec, n_stages = flatten(t.state, 1).numel() * 4, 4
    stats = summary["strategy_stats"]
    assert stats["extra_memory_bytes"] == vec * (n_stages + 1)  # S snapshots + the parity
    assert stats["parity_bytes"] == len(snaps) * n_stages * vec
    assert stats["fallbacks"] == 2 == summary["fallbacks"]


def test_ec_snapshot_refuses_stage0():
    t = make_trainer(tiny_config(), "ec_snapshot")
    with pytest.raises(ValueError, match="cannot recover stage 0"):
        t.strategy.recover(t.state, [0])


def test_strategies_record_their_costs_in_the_summary(tmp_path, monkeypatch):
    """summary.json totals: the async stall leaves out every write (each slowed by SLOW_WRITE s)."""
    slow_disk(monkeypatch)
    for setting in ("checkpoint", "one"):
        _, summary, recs = run(setting, {3: [2]}, tmp_path / setting, save_mode="async")
        stats = summary["strategy_stats"]
        saves = [r for r in recs if r["kind"] == "checkpoint" and r["purpose"] == "strategy"]
        assert stats["saves"] == len(saves) >= 3 and stats["save_bytes"] == sum(r["bytes"] for r in saves)
        assert stats["save_stall_seconds"] == pytest.approx(sum(r["stall_seconds"] for r in saves), abs=1e-5)
        assert stats["save_seconds"] - stats["save_stall_seconds"] >= stats["saves"] * SLOW_WRITE - 1e-5
        assert stats["checkpoint_every"] == 4


def test_one_restores_every_stage_lost_in_the_same_iteration(tmp_path):
    """Three stages (stage 0 among them, one pair adjacent) lost at once: each comes back from the checkpoint."""
    cfg = tiny_config(max_iterations=10, checkpoint_every=4, save_mode="memory")
    t = make_trainer(cfg, "one", ScriptedFailures({6: [0, 2, 3]}))
    t.strategy.setup(t.state)
    for _ in range(4):
        t.step()
    lost_at_4 = full_state(t, [0, 2, 3])
    t.step(), t.step()
    others = full_state(t, [1, 4])
    failed = t.failures.draw(6)
    assert sorted(failed) == [0, 2, 3]
    t.strategy.begin_iteration(t.state, failed)
    t.lose_stages(failed)
    assert same_tensors(full_state(t, [0, 2, 3]), lost_at_4)
    assert same_tensors(full_state(t, [1, 4]), others)
    assert t.state.effective_iteration == 6
    assert t.counts["recoveries"] == 3 and t.counts["fallbacks"] == 0
