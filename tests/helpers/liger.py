"""A stand-in for Liger-Kernel's fused linear cross-entropy (checkfree/loss.py imports it by name), for machines
without it (CI, any CPU): it computes the same token-mean cross-entropy with torch and records every call."""

from __future__ import annotations

import sys
import types

import torch.nn.functional as F

from checkfree.loss import LIGER_MODULE


class FakeLiger:
    """``calls``: one dict (weight, input, target, bias) per call of ``LigerFusedLinearCrossEntropyLoss()(…)``."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        calls = self.calls

        class LigerFusedLinearCrossEntropyLoss:
            def __call__(self, lin_weight, _input, target, bias=None):
                calls.append({"weight": lin_weight, "input": _input, "target": target, "bias": bias})
                logits = _input @ lin_weight.t() + (0 if bias is None else bias)  # (B·T, V)
                return F.cross_entropy(logits.float(), target)

        self.module = types.ModuleType(LIGER_MODULE)
        self.module.LigerFusedLinearCrossEntropyLoss = LigerFusedLinearCrossEntropyLoss
        self.module.__version__ = "0.0-fake"


def install_fake_liger(monkeypatch) -> FakeLiger:
    """Put a :class:`FakeLiger` in ``sys.modules`` (under liger_kernel's names) for one test."""
    fake = FakeLiger()
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, LIGER_MODULE, fake.module)
    return fake


def remove_liger(monkeypatch) -> None:
    """liger-kernel absent for one test, whether or not this machine has it (None in sys.modules: imports fail)."""
    monkeypatch.setitem(sys.modules, "liger_kernel", None)
    for name in ("liger_kernel.transformers", LIGER_MODULE):
        monkeypatch.delitem(sys.modules, name, raising=False)
