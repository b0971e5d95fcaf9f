"""Setting a run up (checkfree/sim/launch.py): the strategy preflight builds and validates is the one that runs."""

from __future__ import annotations

from checkfree.recovery import registry
from checkfree.recovery.neighbours import CheckFree

from helpers.cli import assert_user_error, run_cli, simulate_argv


def test_the_strategy_is_built_once_and_preflights_instance_trains(tmp_path, capsys, monkeypatch):
    built: list[CheckFree] = []
    bound: list[CheckFree] = []

    class Counted(CheckFree):
        def __init__(self, cfg, seed: int = 0):
            super().__init__(cfg, seed)
            built.append(self)

        def bind(self, ctx) -> None:
            super().bind(ctx)
            bound.append(self)

    monkeypatch.setitem(registry.REGISTRY, "checkfree", Counted)
    rc, _, err = run_cli(simulate_argv(tmp_path / "run", setting="checkfree", iterations=2), capsys)
    assert rc == 0, err
    assert len(built) == 1 and bound == built


def test_the_log_names_the_loss_path_once(tmp_path, capsys):
    rc, _, err = run_cli(simulate_argv(tmp_path / "run", iterations=2, setting="no_failure"), capsys)
    assert rc == 0, err
    log = (tmp_path / "run" / "rank0.log").read_text()
    # this machine has no CUDA (CI's): the plain path, and why
    assert log.count("loss: ") == 1 and "loss: plain cross-entropy over fp32 logits (no CUDA)" in log


def test_fused_loss_on_without_cuda_is_one_sentence_and_nothing_is_written(tmp_path, capsys):
    argv = simulate_argv(tmp_path / "run", "--fused-loss", "on", "--device", "cpu", iterations=2)
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, "--fused-loss on needs CUDA, but this run computes on the cpu")
    assert not (tmp_path / "run").exists()


def test_compile_mode_reaches_every_stage_and_needs_compile(tmp_path, capsys, monkeypatch):
    from torch import nn

    from checkfree.model import EmbeddingStage

    seen: list[dict] = []
    monkeypatch.setattr(
        nn.Module, "compile", lambda self, *a, **kw: seen.append(kw)
    )  # recorded, not compiled
    monkeypatch.setattr(EmbeddingStage, "compile", lambda self, *a, **kw: seen.append(kw))
    argv = simulate_argv(tmp_path / "run", "--compile", "--compile-mode", "reduce-overhead", iterations=2)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert (
        seen == [{"backend": "inductor", "mode": "reduce-overhead"}] * 5
    )  # stage 0 and 4 transformer stages
    rc, _, err = run_cli(simulate_argv(tmp_path / "run2", "--compile-mode", "reduce-overhead"), capsys)
    assert_user_error(rc, err, "--compile-mode reduce-overhead was given without --compile")
    assert not (tmp_path / "run2").exists()
