"""E⁻¹ and the loss: stage 0's final norm, LM head and token-mean cross-entropy (nats; paper §6), on two paths.

    plain   final norm → head → logits (B, T, V) → fp32 → ``F.cross_entropy``
    fused   final norm → Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` on the head's weight: the head's
            matmul and the cross-entropy run chunk by chunk of tokens, the gradients of the normalised hidden
            states and of the head's weight computed in the forward, so the (B·T, V) logits never exist whole
            (liger_kernel/ops/fused_linear_cross_entropy.py; checkfree/memory.py models its chunks)

Both divide the summed per-token losses by the number of labels that are not ``ignore_index`` (-100, the default
of ``F.cross_entropy`` and of Liger's loss alike); labels are token ids ≥ 0, so that is every one of the B·T tokens
and both paths take the same token mean. Under bf16 autocast both round the logits to bf16 (the head's matmul
runs in bf16) and compute the softmax in fp32; the plain path's fp32 logit gradient is rounded to bf16 by the
matmul's backward, Liger's is written in bf16: the two agree to bf16 rounding, not bit for bit.

The simulator trains on :func:`forward_loss`'s choice (``--fused-loss auto|on|off``), the swarm's stage 0 on its
config's ``fused_loss``; both call :func:`head_loss`. Validation (the simulator's evaluation, the swarm's
validation batches) and the recovery probe use the plain path on every device: the validation loss and
perplexity are computed exactly as before, so runs with and without the fused loss compare on the same
measure, and without autograd the plain path saves nothing for a backward (its logits are its whole cost).

Host syncs: Liger's loss reads the number of labels that count on the host (``.item()``) in its forward and
compares the upstream gradient with 1.0 (``torch.equal``) in its backward: two waits per microbatch that the
plain path does not have (the trainer's docstring lists every sync).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

FUSED_LOSS_CHOICES = ("auto", "on", "off")
"""``--fused-loss`` (simulator) and ``fused_loss`` (swarm config): auto = fused where CUDA and liger-kernel are."""
LIGER_DISTRIBUTION = "liger-kernel"
"""The pip distribution of Liger-Kernel (pyproject.toml's ``cuda`` extra)."""
LIGER_MODULE = "liger_kernel.transformers.fused_linear_cross_entropy"
"""The module that holds ``LigerFusedLinearCrossEntropyLoss``."""


@dataclass(frozen=True)
class LossPath:
    """Which loss a run trains on, and why (the run's one log line, :attr:`line`)."""

    fused: bool
    reason: str
    """In parentheses after the path: "CUDA, liger-kernel 0.8.5", "no CUDA", "liger-kernel not installed", …"""

    @property
    def line(self) -> str:
        """E.g. "loss: liger fused linear cross-entropy (CUDA, liger-kernel 0.8.5)"."""
        what = "liger fused linear cross-entropy" if self.fused else "plain cross-entropy over fp32 logits"
        return f"loss: {what} ({self.reason})"


def liger_version() -> tuple[str | None, str]:
    """(version, "") when Liger-Kernel's fused loss imports, else (None, why): "liger-kernel not installed" or
    "liger-kernel not importable: <the error>" (installed without triton, say). Imports it (and so triton)."""
    try:
        module = importlib.import_module(LIGER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "liger_kernel":
            return None, f"{LIGER_DISTRIBUTION} not installed"
        return None, f"{LIGER_DISTRIBUTION} not importable: {exc}"
    except ImportError as exc:
        return None, f"{LIGER_DISTRIBUTION} not importable: {exc}"
    try:
        return importlib.metadata.version(LIGER_DISTRIBUTION), ""
    except importlib.metadata.PackageNotFoundError:  # imported from a path pip does not know
        return str(getattr(module, "__version__", "of unknown version")), ""


def resolve_loss_path(choice: str, device_type: str, option: str = "--fused-loss") -> LossPath:
    """The loss path of a run on ``device_type`` ("cuda", "cpu", "meta", …) for ``choice`` ("auto", "on", "off").

    auto: fused on CUDA when Liger-Kernel imports, else plain. on: fused, or ValueError. off: plain.
    ``option`` names the setting in the error ("--fused-loss", or the swarm config's "fused_loss").

    Raises:
        ValueError: ``choice`` is not one of :data:`FUSED_LOSS_CHOICES`; "on" without CUDA, or without an
            importable liger-kernel (one sentence each).
    """
    if choice not in FUSED_LOSS_CHOICES:
        raise ValueError(f"{option} is {choice!r}; expected one of {', '.join(FUSED_LOSS_CHOICES)}.")
    if choice == "off":
        return LossPath(False, f"{option} off")
    if device_type != "cuda":
        if choice == "on":
            raise ValueError(
                f"{option} on needs CUDA, but this run computes on the {device_type}; expected {option} auto or "
                "off there (Liger-Kernel's fused loss runs Triton kernels on a GPU)."
            )
        return LossPath(False, "no CUDA")
    version, why = liger_version()
    if version is None:
        if choice == "on":
            raise ValueError(
                f"{option} on needs Liger-Kernel, but {why}; expected pip install 'liger-kernel>=0.8.5' (the "
                f"'cuda' extra, which ./setup.sh --system-torch installs) or {option} auto or off."
            )
        return LossPath(False, why)
    return LossPath(True, f"CUDA, {LIGER_DISTRIBUTION} {version}")


def _liger_loss() -> Any:
    """A ``LigerFusedLinearCrossEntropyLoss`` (token mean, ignore_index -100: the defaults). Imported on first
    use only, so nothing imports triton unless the fused path runs."""
    return importlib.import_module(LIGER_MODULE).LigerFusedLinearCrossEntropyLoss()


def head_loss(stage0: nn.Module, h: torch.Tensor, labels: torch.Tensor, fused: bool) -> torch.Tensor:
    """Token-mean cross-entropy (nats, 0-dim fp32) of stage 0's head on the last stage's output.

    Args:
        stage0: the :class:`checkfree.model.EmbeddingStage` (its ``final_norm``/``head`` and ``lm_head``).
        h: (B, T, d) hidden states out of the last transformer stage.
        labels: (B, T) int64 next-token ids.
        fused: Liger-Kernel's fused linear cross-entropy (CUDA only: its kernels are Triton's), else the plain
            path (module docstring). Decide with :func:`resolve_loss_path`.
    """
    if not fused:
        logits = stage0.head(h)  # (B, T, V)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
    x = stage0.final_norm(h)  # (B, T, d); the head's matmul runs inside the fused loss
    lm_head = stage0.lm_head
    return _liger_loss()(lm_head.weight, x.reshape(-1, x.shape[-1]), labels.reshape(-1), lm_head.bias)
