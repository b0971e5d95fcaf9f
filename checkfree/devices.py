"""Where a run's tensors live: the autocast a device gets and the host → device batch copy (paper §6 trains in
bf16 on GPUs; on a CPU fp32 is the fast path, bf16 matmul runs ~400× slower there). Shared by the simulator, the
probe and the benchmarks.
"""

from __future__ import annotations

import torch


def autocast_context(device: torch.device, mode: str) -> torch.autocast:
    """The autocast of a run: bf16 on CUDA for "auto", bf16 on any device for "bf16", disabled for "off" (and
    for "auto" on a CPU, which has no fast bf16 matmul). Raises ValueError for another mode."""
    if mode not in ("auto", "bf16", "off"):
        raise ValueError(f"autocast is {mode!r}; expected 'auto', 'bf16' or 'off'.")
    on = mode == "bf16" or (mode == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=on)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``batch`` on ``device``; to CUDA through pinned memory with a non-blocking copy (no host sync)."""
    if device.type != "cuda":
        return batch.to(device)
    return batch.pin_memory().to(device, non_blocking=True)
