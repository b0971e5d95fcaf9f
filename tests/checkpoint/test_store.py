"""Universal checkpoints: layout changes, checksums, atomic writes under SIGKILL, retention."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from checkfree.checkpoint import store
from checkfree.checkpoint.store import CheckpointError

from helpers import ROOT, ScriptedFailures, make_trainer, params_of, sigkill_when, tiny_config

pytestmark = pytest.mark.timeout(120)


def trained(cfg, steps: int, **kw):
    t = make_trainer(cfg, "no_failure", ScriptedFailures(), **kw)
    for _ in range(steps):
        t.step()
    return t


def save(trainer, root: Path, keep: int = 3) -> Path:
    snap = store.capture(trainer.state, trainer.cfg.n_layers_per_stage, trainer.cfg.to_json())
    return store.write_snapshot(snap, root, keep=keep)


def test_resume_4x3_into_6x2_gives_the_same_next_losses(tmp_path):
    """A 4 stages × 3 layers checkpoint loads into 6 × 2; the next two training losses equal continuing 4 × 3.

    The second loss checks that Adam's state went to the right layers (no clipping, which is per stage).
    """
    a_cfg = tiny_config(n_stages=4, n_layers_per_stage=3, grad_clip=1e9)
    a = trained(a_cfg, 3)
    path = save(a, tmp_path)
    b = make_trainer(tiny_config(n_stages=6, n_layers_per_stage=2, grad_clip=1e9), "no_failure", seed=7)
    b.resume(path)
    assert b.state.effective_iteration == 3
    for _ in range(2):
        assert b.step() == pytest.approx(a.step(), abs=1e-6)
    flat_a = torch.cat([p.reshape(-1) for p in params_of(a)])
    flat_b = torch.cat([p.reshape(-1) for p in params_of(b)])  # same global layer order
    assert torch.allclose(flat_a, flat_b, atol=1e-6)


def test_resume_same_layout_is_bit_exact(tmp_path):
    cfg = tiny_config()
    a = trained(cfg, 3)
    b = make_trainer(cfg, "no_failure", seed=5)
    b.resume(save(a, tmp_path))
    a.step(), b.step()
    assert all(torch.equal(x, y) for x, y in zip(params_of(a), params_of(b), strict=True))


def checkpoint_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file())


@pytest.mark.parametrize("index", range(8))  # each file of the checkpoint: one flipped bit
def test_one_corrupt_byte_is_refused_naming_the_file_and_nothing_is_loaded(tmp_path, index):
    cfg = tiny_config()
    path = save(trained(cfg, 1), tmp_path)
    files = checkpoint_files(path)
    victim = files[index % len(files)]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    fresh = make_trainer(cfg, "no_failure", seed=3)
    before = params_of(fresh)
    with pytest.raises(CheckpointError, match=victim.name.replace(".", r"\.")):
        fresh.resume(path)
    assert all(torch.equal(x, y) for x, y in zip(before, params_of(fresh), strict=True))
    assert fresh.state.iteration == 0


def test_truncated_and_missing_files_are_refused(tmp_path):
    path = save(trained(tiny_config(), 1), tmp_path)
    layer = path / "layer_0002.safetensors"
    layer.write_bytes(layer.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"layer_0002\.safetensors has .* bytes.*truncated"):
        store.read_checkpoint(path)
    layer.unlink()
    with pytest.raises(CheckpointError, match=r"layer_0002\.safetensors is missing"):
        store.read_checkpoint(path)
    with pytest.raises(CheckpointError, match="nowhere does not exist; existing checkpoints: iter_0000001"):
        store.read_checkpoint(tmp_path / "nowhere")


def test_a_layout_that_does_not_fit_is_refused_before_anything_changes(tmp_path):
    path = save(trained(tiny_config(), 1), tmp_path)
    other = make_trainer(tiny_config(n_stages=2, n_layers_per_stage=1))
    with pytest.raises(CheckpointError, match="4 transformer layers; the model has 2 × 1"):
        other.resume(path)
    snap = store.read_checkpoint(path)
    snap.files["layer_0003"]["param/mlp.down_proj.weight"] = torch.zeros(3, 3)  # only the last stage is off
    fresh = make_trainer(tiny_config(), seed=1)
    before = params_of(fresh)
    with pytest.raises(CheckpointError, match="stage 4 parameter 'layers.0.mlp.down_proj.weight'.*shape"):
        store.restore(snap, fresh.state, 1)
    assert all(torch.equal(x, y) for x, y in zip(before, params_of(fresh), strict=True))


def test_keeps_the_newest_n_and_resaving_an_iteration_replaces_it(tmp_path):
    t = make_trainer(tiny_config())
    for e in range(5):
        t.state.effective_iteration = e
        save(t, tmp_path, keep=2)
    assert [p.name for p in store.list_checkpoints(tmp_path)] == ["iter_0000003", "iter_0000004"]
    t.state.iteration = 99
    save(t, tmp_path, keep=2)  # effective 4 again (after a rollback)
    assert store.read_checkpoint(tmp_path / "iter_0000004").iteration == 99
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_metadata_records_layers_optimizer_positions_rng_and_config(tmp_path):
    cfg = tiny_config()
    t = trained(cfg, 2)
    snap = store.read_checkpoint(save(t, tmp_path))
    meta = snap.meta
    assert meta["layer_stage"] == {"0": 1, "1": 2, "2": 3, "3": 4}
    assert meta["effective_iteration"] == 2 and meta["config"]["dmodel"] == cfg.dmodel
    assert set(meta["files"]) >= {"stage0.safetensors", "layer_0000.safetensors", "extra.safetensors"}
    layer = snap.files["layer_0001"]
    assert {k.split("/")[0] for k in layer} == {"param", "exp_avg", "exp_avg_sq", "step"}
    assert float(layer["step/mlp.down_proj.weight"]) == 2.0
    assert torch.equal(snap.files["extra"]["rng/torch"], torch.get_rng_state())


KILL_SCRIPT = textwrap.dedent("""
    import sys, torch
    from checkfree.checkpoint.store import Snapshot, write_snapshot
    root = sys.argv[1]
    big = {"param/w": torch.arange(12_000_000, dtype=torch.float32)}  # 48 MB: each save takes a while
    for i in range(1_000_000):
        meta = {"format": "checkfree-universal-v2", "iteration": i, "effective_iteration": i, "n_stages": 1,
                "n_layers_per_stage": 1, "lr_multipliers": [1.0, 1.0], "grad_norms": [1.0, 1.0]}
        write_snapshot(Snapshot(i, i, {"layer_0000": big, "extra": {"i": torch.tensor(i)}}, meta), root, keep=2)
""")


@pytest.mark.timeout(90)
def test_sigkill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    root = tmp_path / "ck"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(root)], env=env, stderr=subprocess.PIPE)
    sigkill_when(
        proc,
        lambda: bool(
            store.list_checkpoints(root) and any(p.name.startswith(".tmp-") for p in root.iterdir())
        ),
        "the saving process never had a checkpoint and a save in progress at once",
        60,
        poll=0.01,
    )
    assert any(p.name.startswith(".tmp-") for p in root.iterdir())  # killed mid-save
    newest = store.list_checkpoints(root)[-1]
    snap = store.read_checkpoint(newest)  # verifies every checksum
    assert int(snap.files["extra"]["i"]) == snap.effective_iteration
    assert torch.equal(
        snap.files["layer_0000"]["param/w"][-3:], torch.tensor([11_999_997.0, 11_999_998.0, 11_999_999.0])
    )


def test_a_failure_right_after_a_resume_is_recovered_as_in_the_run_that_never_stopped(tmp_path):
    """The checkpoint carries CheckFree's ω (the last step's gradient norms) and the LR multipliers: the first
    iteration after a resume rebuilds a failed stage with the same weights, at the same learning rate."""
    cfg = tiny_config()
    failures = ScriptedFailures({1: [3], 3: [2]})  # stage 3 rebuilt earlier (lr × lr_scale); stage 2 at once
    a = make_trainer(cfg, "checkfree", failures)
    for _ in range(3):
        a.step()
    b = make_trainer(cfg, "checkfree", failures, seed=5)
    b.resume(save(a, tmp_path))
    assert b.state.grad_norms == a.state.grad_norms and b.state.lr_multipliers == a.state.lr_multipliers
    a.step(), b.step()
    assert all(torch.equal(x, y) for x, y in zip(params_of(a), params_of(b), strict=True))


def test_a_full_disk_while_saving_is_one_sentence_and_leaves_the_last_checkpoint(tmp_path, monkeypatch):
    from checkfree.checkpoint import store

    root = tmp_path / "checkpoints"
    files = {"stage0": {"param/w": torch.zeros(256, 256)}, "layer_0000": {"param/w": torch.ones(256, 256)}}
    first = store.write_snapshot(store.Snapshot(2, 2, files, {}), root)
    written = []

    def full(tensors, path):
        if written:
            raise store.SafetensorError(
                "Error while serializing: IoError(No space left on device (os error 28))"
            )
        written.append(path)
        torch.save(tensors, path)

    monkeypatch.setattr(store, "save_file", full)
    with pytest.raises(store.CheckpointError) as info:
        store.write_snapshot(store.Snapshot(4, 4, files, {}), root)
    message = str(info.value)
    assert "No space left on device" in message and "needs about 0.5 MiB" in message
    assert f"the last complete checkpoint is {first}" in message and "\n" not in message
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002"]  # no .tmp-* left behind
