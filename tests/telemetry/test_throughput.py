"""Throughput and MFU arithmetic against a hand count, the device peak, and the bf16 autocast path on a CPU."""

from __future__ import annotations

import pytest
import torch

from checkfree.config import load_config
from checkfree.devices import autocast_context
from checkfree.model import build_stages
from checkfree.recovery.registry import make_strategy
from checkfree.sim.trainer import RunContext, Trainer
from checkfree.telemetry.metrics import MetricsSink
from checkfree.telemetry.throughput import (
    Peak,
    ThroughputMeter,
    device_peak,
    model_flops_per_token,
    stages_flops_per_token,
    table_peak,
)

from helpers import VOCAB, RandomBatches, ScriptedFailures, tiny_config


class ListSink(MetricsSink):
    def __init__(self):
        super().__init__(None)
        self.records: list[dict] = []

    def write(self, kind, **fields):
        record = super().write(kind, **fields)
        self.records.append(record)
        return record


def test_flops_per_token_of_the_tiny_config_by_hand():
    cfg = load_config("tiny_config.json")  # LLaMa d=128, 4 stages × 1 layer, seq 128, vocab 4096
    d, ffn, vocab, layers, seq = 128, 4 * 128, 4096, 4, 128
    per_layer = 4 * d * d + 3 * d * ffn + 2 * d  # q, k, v, o; gate, up, down (SwiGLU); two RMSNorm weights
    n = layers * per_layer + d + d * vocab  # + final RMSNorm + untied LM head; the embedding table left out
    assert n == 1_574_016
    hand = 6 * n + 12 * layers * d * seq  # PaLM appendix B
    assert hand == 10_230_528
    with torch.device("meta"):
        stages = build_stages(cfg, vocab, seed=0)
    assert stages_flops_per_token(stages, cfg.n_layers, cfg.dmodel, cfg.seq_l) == hand
    assert model_flops_per_token(n, layers, d, seq) == hand


def test_mfu_is_model_flops_times_tokens_per_second_over_the_peak_of_all_replicas():
    meter = ThroughputMeter(flops_per_token=10_230_528, peak=Peak(100e9, "test"), world_size=2)
    first = meter.record(tokens=8192, seconds=2.0)  # warm-up: in the record, not in the run mean
    assert first == {"tokens_per_second": 4096.0, "mfu": round(10_230_528 * 4096 / (2 * 100e9), 6)}
    meter.record(tokens=8192, seconds=1.0)
    meter.record(tokens=8192, seconds=3.0)
    summary = meter.summary()
    assert summary["tokens_per_second"] == 16384 / 4.0
    assert summary["mfu"] == pytest.approx(10_230_528 * 4096 / 200e9, rel=1e-5)
    assert ThroughputMeter(1, Peak(None, "unknown")).record(10, 1.0)["mfu"] is None


def test_device_peak_comes_from_the_flag_or_a_measured_cpu_matmul():
    assert device_peak(torch.device("cpu"), 989.0) == Peak(989e12, "--peak-tflops 989")
    cpu = device_peak(torch.device("cpu"))
    assert cpu.flops > 1e8 and cpu.source.startswith("measured: fp32 1024×1024 matmul")
    with pytest.raises(ValueError, match="--peak-tflops is 0"):
        device_peak(torch.device("cpu"), 0.0)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM5
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),  # a substring match gave the SXM's 989
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA L40", 181.0),  # a substring match gave the L4's 121
        ("NVIDIA L40S", 362.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA RTX A6000", 154.8),
        ("NVIDIA GeForce RTX 4090", 165.2),
        ("Tesla V100-SXM2-16GB", 125.0),
        ("  nvidia   l40s ", 362.0),  # whitespace and case are normalised, nothing else
        ("NVIDIA A10G", None),  # no data sheet: unknown, not the A10's 125
        ("NVIDIA H100", None),  # which H100? SXM, PCIe and NVL differ
        ("NVIDIA L40 (custom)", None),
        ("NVIDIA GeForce RTX 4090 D", None),
        ("AMD Instinct MI300X", None),
    ],
)
def test_the_peak_table_matches_the_exact_gpu_name(name, tflops):
    peak = table_peak(name)
    if tflops is None:
        assert peak.flops is None and "pass --peak-tflops" in peak.source and name in peak.source
    else:
        assert peak == Peak(tflops * 1e12, f"{name}: {tflops:g} TFLOP/s dense bf16 (data sheet)")


@pytest.mark.timeout(120)
def test_bf16_autocast_trains_two_iterations_on_cpu_with_fp32_master_weights_and_adam_state():
    cfg = tiny_config(dmodel=32, seq_l=16, batch_size=2, mb_count=2, max_iterations=2)
    sink = ListSink()
    trainer = Trainer(
        cfg,
        build_stages(cfg, VOCAB, seed=0),
        RandomBatches(cfg),
        [RandomBatches(cfg, seed=99).batch(0)],
        make_strategy("checkfree", cfg, True),
        ScriptedFailures({1: [2]}),
        RunContext(
            sink=sink, autocast="bf16"
        ),  # what the hidden `--autocast bf16` sets: the CUDA path on a CPU
        swaps=True,
    )
    seen: list[torch.dtype] = []
    hook = (
        trainer.state.stages[1]
        .layers[0]
        .mlp.down_proj.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    )
    trainer.state.stages[0].lm_head.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    losses = [trainer.step() for _ in range(2)]
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}  # the matmuls ran in bf16
    assert all(torch.isfinite(torch.tensor(loss)) for loss in losses)
    for stage, opt in zip(trainer.state.stages, trainer.state.optimizers, strict=True):
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in stage.parameters())
        for state in opt.state.values():
            assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    assert [r["kind"] for r in sink.records].count(
        "recovery"
    ) == 1  # stage 2 failed at iteration 1: recovered
    train = [r for r in sink.records if r["kind"] == "train"]
    assert all(r["tokens_per_second"] > 0 and "mfu" in r for r in train)


def test_autocast_modes():
    assert autocast_context(torch.device("cpu"), "auto").fast_dtype == torch.bfloat16
    assert not autocast_context(torch.device("cpu"), "auto")._enabled
    assert autocast_context(torch.device("cpu"), "bf16")._enabled
    with pytest.raises(ValueError, match="autocast is 'fp8'"):
        autocast_context(torch.device("cpu"), "fp8")
