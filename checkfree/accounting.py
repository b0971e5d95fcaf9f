"""Per-failure recovery accounting: how far a rebuilt stage is from the one that was lost, and what it cost.

Before the failed stages are destroyed, the trainer keeps a copy of their weights for the measurement only: it is
a local of :meth:`RecoveryAccounting.measure`, never stored on the training state, the strategy or the run
context, so no strategy can read it. After the recovery each ``recovery`` record gains

- ``weight_rel_l2`` = ‖W_rebuilt − W_lost‖ / ‖W_lost‖ and ``weight_cosine`` = cos(W_rebuilt, W_lost), over every
  floating tensor of the stage, flattened (:func:`weight_distance`);
- ``probe_loss_before`` / ``probe_loss_after``: the cross-entropy (nats) of the stages in order on one fixed
  held-out probe batch just before the failure and just after the recovery (before the next optimizer step), and
  ``loss_spike`` = after − before;
- ``accounting_seconds``: what the measurement cost (two no-grad forwards of one batch and a copy of the lost
  stages, on failure iterations only).

The probe forward uses no randomness (the models have no dropout), so a run with accounting trains bit-identically
to one without (``--no-recovery-accounting``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager

import torch

from checkfree.pipeline import forward_loss
from checkfree.recovery.base import RecoveryRecord
from checkfree.training_state import TrainingState


def weight_distance(
    lost: Mapping[str, torch.Tensor], rebuilt: Mapping[str, torch.Tensor]
) -> tuple[float, float]:
    """(‖W_rebuilt − W_lost‖ / ‖W_lost‖, cos(W_rebuilt, W_lost)) over every floating tensor, flattened, in float64.

    Raises:
        ValueError: the state dicts differ in keys or shapes, or the lost weights are all zero.
    """
    if lost.keys() != rebuilt.keys():
        raise ValueError("lost and rebuilt stages differ in keys.")
    keys = [k for k, v in lost.items() if v.is_floating_point()]
    if any(lost[k].shape != rebuilt[k].shape for k in keys):
        raise ValueError("lost and rebuilt stages differ in shapes.")
    a = torch.cat([lost[k].detach().double().reshape(-1).cpu() for k in keys])
    b = torch.cat([rebuilt[k].detach().double().reshape(-1).cpu() for k in keys])
    norm = float(a.norm())
    if norm == 0:
        raise ValueError("the lost stage's weights are all zero: no relative distance.")
    denom = norm * float(b.norm())
    cosine = float(a @ b) / denom if denom else 0.0
    return float((b - a).norm()) / norm, cosine


class RecoveryAccounting:
    """Measures every recovery of a trainer against the stages it replaced.

    Args:
        probe_batch: (B, T+1) token ids, a fixed held-out batch (the first validation batch).
        autocast: the trainer's autocast context factory (bf16 on CUDA, disabled on CPU).
    """

    def __init__(self, probe_batch: torch.Tensor, autocast: Callable[[], AbstractContextManager]):
        self.probe_batch, self.autocast = probe_batch, autocast
        self.seconds = 0.0

    @torch.no_grad()
    def probe_loss(self, state: TrainingState) -> float:
        """Cross-entropy (nats) of the stages in order on the probe batch. Note: a device-host sync point."""
        batch = self.probe_batch.to(next(state.stages[0].parameters()).device)
        with self.autocast():
            return float(forward_loss(state.stages, batch, range(1, state.n_stages + 1)))

    def measure(
        self,
        state: TrainingState,
        failed: list[int],
        lose_and_recover: Callable[[], list[RecoveryRecord]],
    ) -> list[RecoveryRecord]:
        """Run ``lose_and_recover`` (destroy ``failed``, let the strategy rebuild) and add the accounting fields
        to each record it returns. The copy of the lost weights lives only in this call."""
        t0 = time.perf_counter()
        lost = {s: state.stage_state(s) for s in failed}
        before = self.probe_loss(state)
        spent = time.perf_counter() - t0
        records = lose_and_recover()
        t1 = time.perf_counter()
        after = self.probe_loss(state)
        for rec in records:
            fields: dict[str, float | None] = {"weight_rel_l2": None, "weight_cosine": None}
            if rec.stage in lost:
                rel, cos = weight_distance(lost[rec.stage], state.stage_state(rec.stage))
                fields = {"weight_rel_l2": rel, "weight_cosine": cos}
            rec.extra.update(
                fields, probe_loss_before=before, probe_loss_after=after, loss_spike=after - before
            )
        spent += time.perf_counter() - t1
        for rec in records:
            rec.extra["accounting_seconds"] = round(spent / max(1, len(records)), 6)
        self.seconds += spent
        return records
