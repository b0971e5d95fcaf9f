"""The swarm's stage 0 computes its loss with the simulator's function (checkfree.loss.head_loss), on the path its
config's ``fused_loss`` chooses; validation keeps the plain path. Liger's loss is a stand-in (tests/helpers/liger.py)."""

from __future__ import annotations

import pytest
import torch

from checkfree.config import ConfigError
from checkfree.loss import head_loss
from checkfree.model import build_stages
from checkfree.swarm.config import swarm_config_from_dict
from checkfree.swarm.node.compute import StageWorker

from helpers import VOCAB, tiny_config
from helpers.cli import assert_user_error, run_cli, swarm_argv
from helpers.liger import install_fake_liger


def _inputs(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, cfg.seq_l, cfg.dmodel, generator=g), torch.randint(
        0, VOCAB, (2, cfg.seq_l), generator=g
    )


def test_a_fused_stage0_worker_takes_liger_and_returns_the_plain_paths_gradient(monkeypatch):
    fake = install_fake_liger(monkeypatch)
    cfg = tiny_config()
    stage0 = build_stages(cfg, VOCAB, seed=0)[0]
    h, labels = _inputs(cfg)
    plain_loss, plain_grad = StageWorker(stage0, 0).head_loss((0, 0), h.clone(), labels, mb_count=4)
    assert fake.calls == []
    fused_loss, fused_grad = StageWorker(stage0, 0, fused_loss=True).head_loss(
        (0, 0), h.clone(), labels, mb_count=4
    )
    assert len(fake.calls) == 1
    assert fused_loss == pytest.approx(plain_loss, rel=1e-6)
    torch.testing.assert_close(fused_grad, plain_grad, rtol=1e-5, atol=1e-8)
    # the loss is the simulator's: head_loss on the same inputs
    assert plain_loss == pytest.approx(float(head_loss(stage0, h, labels, fused=False).detach()), rel=1e-7)


def test_the_swarm_config_takes_fused_loss_and_refuses_another_value():
    assert swarm_config_from_dict({"model_config": "tiny_config.json"}).fused_loss == "auto"
    assert (
        swarm_config_from_dict({"model_config": "tiny_config.json", "fused_loss": "off"}).fused_loss == "off"
    )
    with pytest.raises(
        ConfigError, match=r"'fused_loss' is 'yes'; expected one of \['auto', 'on', 'off'\]\.$"
    ):
        swarm_config_from_dict({"model_config": "tiny_config.json", "fused_loss": "yes"})


def test_swarm_run_with_fused_loss_on_and_no_cuda_is_one_sentence_before_anything_starts(tmp_path, capsys):
    argv = swarm_argv(tmp_path, "--set", "fused_loss=on", "--device", "cpu")
    rc, _, err = run_cli(argv, capsys)
    assert_user_error(rc, err, "fused_loss on needs CUDA, but this run computes on the cpu")
    assert not (tmp_path / "run").exists()
