"""Throughput and model FLOPs utilisation (MFU) of a training run, and its peak memory.

Model FLOPs per token (PaLM, Chowdhery et al. 2022, appendix B):

    flops_per_token = 6·N + 12·L·d·T

N = parameters that a token's forward and backward multiply through: every parameter except the input embedding
tables (token embedding, and GPT's learned positions: lookups, not matmuls), so the untied LM head counts (our
stage 0 keeps it untied, docs/paper.md §6; PaLM's is tied, hence its "non-embedding" N). 6·N = 2 FLOPs per multiply-add
× (forward + 2 × backward). 12·L·d·T = the attention score and value matmuls (QKᵀ and AV), forward and backward,
for L layers of width d over a sequence of T tokens (no causal-mask discount, as in PaLM).

    MFU = flops_per_token × tokens/s ÷ (W × peak FLOP/s of one device)

with tokens/s summed over the W data-parallel replicas. The peak comes from ``--peak-tflops``, else from
:data:`PEAK_TFLOPS` (dense bf16 tensor-core peaks from the vendors' data sheets, by exact GPU name), else, on a
CPU, from a timed fp32 matmul on this machine (:func:`measure_cpu_peak`: a measured, not a data-sheet, peak; the
run log and summary.json say which).
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

PEAK_TFLOPS: dict[str, float] = {
    # Dense (no sparsity) bf16 tensor-core TFLOP/s by the exact torch.cuda.get_device_name() string (compared
    # after normalise_gpu_name): the vendor data sheets' figures "with sparsity" halved. A name missing here has
    # no peak (MFU null, a note to pass --peak-tflops): a substring match gave "NVIDIA H200 NVL" the SXM's 989
    # and "NVIDIA L40" the L4's 121. Sources: NVIDIA data sheets of H100 (2023: SXM 1,979, PCIe 1,513 sparse),
    # H100 NVL (1,671 sparse), H200 (SXM 1,979, NVL 1,671 sparse), GH200 (1,979 sparse), HGX B200 (4.5 PFLOP/s
    # sparse per GPU), A100 (312 dense), A10 (125), A40 (149.7), L4 (242 sparse), L40 (181.05), L40S (362.05),
    # RTX A6000 (154.8); the Ada (RTX 4090: 165.2) and GA102 (RTX 3090: 71) whitepapers, bf16 with fp32
    # accumulate; V100 (SXM2 125, PCIe 112: fp16, Volta has no bf16). The A10G (AWS) has no NVIDIA data sheet
    # and third-party figures disagree (70 or 125), so it is left out.
    "NVIDIA H100 80GB HBM3": 989.0,  # SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA H200": 989.0,  # SXM
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA GH200 480GB": 989.0,
    "NVIDIA GH200 144G HBM3e": 989.0,
    "NVIDIA B200": 2250.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
    "NVIDIA A10": 125.0,
    "NVIDIA A40": 149.7,
    "NVIDIA L4": 121.0,
    "NVIDIA L40": 181.0,
    "NVIDIA L40S": 362.0,
    "NVIDIA RTX A6000": 154.8,
    "NVIDIA GeForce RTX 4090": 165.2,
    "NVIDIA GeForce RTX 3090": 71.0,
    "Tesla V100-SXM2-16GB": 125.0,
    "Tesla V100-SXM2-32GB": 125.0,
    "Tesla V100-PCIE-16GB": 112.0,
    "Tesla V100-PCIE-32GB": 112.0,
}
CPU_MATMUL_SIZE = 1024


@dataclass(frozen=True)
class Peak:
    """A device's peak FLOP/s and where the number came from (for the run log and summary.json)."""

    flops: float | None
    source: str


def embedding_parameters(stage0: nn.Module) -> int:
    """Parameters of stage 0's input embedding tables (token embedding, GPT's learned positions)."""
    tables = [getattr(stage0, "embed_tokens", None), getattr(stage0, "positions", None)]
    return sum(p.numel() for t in tables if t is not None for p in t.parameters())


def model_flops_per_token(non_embedding_params: int, n_layers: int, d_model: int, seq_len: int) -> int:
    """6·N + 12·L·d·T model FLOPs per trained token (PaLM appendix B; see the module docstring)."""
    return 6 * non_embedding_params + 12 * n_layers * d_model * seq_len


def stages_flops_per_token(stages: list[nn.Module], n_layers: int, d_model: int, seq_len: int) -> int:
    """:func:`model_flops_per_token` of ``[stage 0, stage 1, …, stage S]`` (N counted from the modules)."""
    total = sum(p.numel() for s in stages for p in s.parameters())
    return model_flops_per_token(total - embedding_parameters(stages[0]), n_layers, d_model, seq_len)


def measure_cpu_peak(size: int = CPU_MATMUL_SIZE, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` fp32 (size × size) @ (size × size) matmuls on this CPU (~0.2 s)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up: thread pool, caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def normalise_gpu_name(name: str) -> str:
    """A GPU name as :data:`PEAK_TFLOPS` compares it: whitespace runs collapsed to one space, case folded."""
    return " ".join(name.split()).casefold()


_PEAKS_BY_NAME = {normalise_gpu_name(k): v for k, v in PEAK_TFLOPS.items()}


def table_peak(name: str) -> Peak:
    """The data-sheet peak of the GPU called ``name`` (``torch.cuda.get_device_name``), matched exactly after
    :func:`normalise_gpu_name`; an unknown name gives Peak(None, a note telling the user to pass --peak-tflops)."""
    tflops = _PEAKS_BY_NAME.get(normalise_gpu_name(name))
    if tflops is None:
        return Peak(
            None,
            f"{name}: peak unknown (not in the data-sheet table of checkfree/telemetry/throughput.py); "
            "pass --peak-tflops to report MFU",
        )
    return Peak(tflops * 1e12, f"{name}: {tflops:g} TFLOP/s dense bf16 (data sheet)")


def device_peak(device: torch.device, peak_tflops: float | None = None) -> Peak:
    """The peak FLOP/s that MFU divides by: ``peak_tflops`` if given, else the table entry of a CUDA device
    (:func:`table_peak`), else a measured fp32 matmul peak on a CPU. An unknown CUDA device gives Peak(None, …):
    MFU is then not reported. Raises ValueError for a non-positive ``peak_tflops``."""
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"--peak-tflops is {peak_tflops}; expected a positive number of TFLOP/s.")
        return Peak(peak_tflops * 1e12, f"--peak-tflops {peak_tflops:g}")
    if device.type == "cuda":
        return table_peak(torch.cuda.get_device_name(device))
    flops = measure_cpu_peak()
    return Peak(
        flops,
        f"measured: fp32 {CPU_MATMUL_SIZE}×{CPU_MATMUL_SIZE} matmul on the CPU, {torch.get_num_threads()} "
        f"threads, {flops / 1e9:.1f} GFLOP/s",
    )


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): torch.cuda.max_memory_allocated on CUDA, else this process's max RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "torch.cuda.max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process max RSS"


class ThroughputMeter:
    """tokens/s and MFU per iteration, and their run means (the first iteration, a warm-up, left out)."""

    def __init__(self, flops_per_token: int, peak: Peak, world_size: int = 1):
        self.flops_per_token, self.peak, self.world_size = flops_per_token, peak, world_size
        self.tokens = 0
        self.seconds = 0.0
        self.iterations = 0

    def record(self, tokens: int, seconds: float) -> dict[str, float | None]:
        """Fields of one train record: tokens_per_second (all replicas) and mfu (None without a peak)."""
        if self.iterations > 0:
            self.tokens += tokens
            self.seconds += seconds
        self.iterations += 1
        rate = tokens / seconds if seconds > 0 else 0.0
        return {"tokens_per_second": round(rate, 1), "mfu": self.mfu(rate)}

    def mfu(self, tokens_per_second: float) -> float | None:
        """flops_per_token × tokens/s ÷ (W × peak), or None when the peak is unknown."""
        if self.peak.flops is None:
            return None
        return round(self.flops_per_token * tokens_per_second / (self.world_size * self.peak.flops), 6)

    def summary(self) -> dict[str, object]:
        """Run means (iterations after the first) for summary.json."""
        rate = self.tokens / self.seconds if self.seconds > 0 else None
        return {
            "tokens_per_second": None if rate is None else round(rate, 1),
            "mfu": None if rate is None else self.mfu(rate),
            "model_flops_per_token": self.flops_per_token,
            "peak_flops": self.peak.flops,
            "peak_flops_source": self.peak.source,
        }
