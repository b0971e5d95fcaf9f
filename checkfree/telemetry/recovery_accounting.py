"""Per-failure recovery accounting: how far a rebuilt stage is from the stage that was lost, and the loss spike.

The paper's premise (§4.1) is that a lost stage is well approximated from its neighbours; these numbers let a
run show how well, failure by failure. Before failed stages are destroyed the trainer calls :meth:`keep`, which
copies their weights into a :class:`LostStages` that only the trainer holds: the strategy is given the
TrainingState, where the failed stages are NaN, and never this object (tests/telemetry/test_recovery_accounting.py walks
everything a strategy can reach and finds no copy). After the strategy has rebuilt them, :meth:`annotate` adds
to each recovery record:

    weight_rel_l2      ‖W_rebuilt − W_lost‖₂ / ‖W_lost‖₂, over every floating-point tensor of the stage's state
                       dict taken as one vector (float64 sums; None when ‖W_lost‖ = 0)
    weight_cosine      ⟨W_rebuilt, W_lost⟩ / (‖W_rebuilt‖₂ ‖W_lost‖₂) (None when a norm is 0)
    probe_loss_before  token-mean cross-entropy (nats) of the fixed probe batch, stages in order, just before the
                       failure; the same for every stage that failed in that iteration
    probe_loss_after   the same just after the recovery, before the next optimizer step
    loss_spike         probe_loss_after − probe_loss_before
    accounting_seconds the time this measurement took for the whole failure iteration (its cost)

The lost weights are dropped as soon as the records are annotated. ``--no-recovery-accounting`` turns it off.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from checkfree.pipeline import forward_loss
from checkfree.recovery.record import RecoveryRecord
from checkfree.training_state import StateDict, TrainingState


@dataclass
class LostStages:
    """The weights of the stages that failed in one iteration, copied before they were destroyed."""

    weights: dict[int, StateDict]
    probe_loss_before: float | None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def weight_distance(rebuilt: StateDict, lost: StateDict) -> tuple[float | None, float | None]:
    """(relative L2 distance, cosine similarity) of two state dicts taken as single vectors (float64).

    Only floating-point tensors count. The relative distance is None when ‖lost‖ = 0, the cosine when either
    norm is 0.

    Raises:
        ValueError: the state dicts differ in keys or shapes.
    """
    if rebuilt.keys() != lost.keys():
        raise ValueError(f"rebuilt and lost stages differ in keys: {sorted(set(rebuilt) ^ set(lost))[:4]}.")
    diff2 = dot = norm_r2 = norm_l2 = 0.0
    for k, w_lost in lost.items():
        w_new = rebuilt[k]
        if w_new.shape != w_lost.shape:
            raise ValueError(f"tensor {k!r} has shapes {tuple(w_new.shape)} and {tuple(w_lost.shape)}.")
        if not w_lost.is_floating_point():
            continue
        a, b = w_new.detach().double(), w_lost.detach().double()
        diff2 += float((a - b).pow(2).sum())
        dot += float((a * b).sum())
        norm_r2 += float(a.pow(2).sum())
        norm_l2 += float(b.pow(2).sum())
    rel = math.sqrt(diff2) / math.sqrt(norm_l2) if norm_l2 > 0 else None
    cosine = dot / math.sqrt(norm_r2 * norm_l2) if norm_r2 > 0 and norm_l2 > 0 else None
    return rel, cosine


class RecoveryAccounting:
    """Measures each recovery against the lost stage; see the module docstring.

    Args:
        probe: (B, T+1) int64 token ids, a fixed held-out batch (the first validation batch), or None for the
            weight distances only.
        autocast: the trainer's autocast context (bf16 on CUDA), so the probe matches validation.
    """

    def __init__(self, probe: torch.Tensor | None, autocast: Any):
        self.probe, self.autocast = probe, autocast
        self.seconds = 0.0
        """Total seconds spent on accounting in this run."""

    @torch.no_grad()
    def probe_loss(self, state: TrainingState) -> float | None:
        """Cross-entropy (nats) of the probe batch through stages 0, 1..S, 0 in order; None without a probe."""
        if self.probe is None:
            return None
        device = next(state.stages[0].parameters()).device
        with self.autocast:
            loss = forward_loss(state.stages, self.probe.to(device), range(1, state.n_stages + 1))
        return float(loss)

    def keep(self, state: TrainingState, failed: list[int]) -> LostStages:
        """Copy the failed stages' weights and measure the probe loss; call before they are destroyed."""
        t0 = time.perf_counter()
        lost = LostStages({s: state.stage_state(s) for s in failed}, self.probe_loss(state))
        lost.seconds = time.perf_counter() - t0
        return lost

    def annotate(self, lost: LostStages, state: TrainingState, records: list[RecoveryRecord]) -> None:
        """Add the distances and probe losses to each record (in ``extra``), then drop the lost weights."""
        t0 = time.perf_counter()
        after = self.probe_loss(state)
        before = lost.probe_loss_before
        for rec in records:
            rel, cosine = weight_distance(state.stage_state(rec.stage), lost.weights[rec.stage])
            rec.extra.update(
                weight_rel_l2=rel,
                weight_cosine=cosine,
                probe_loss_before=before,
                probe_loss_after=after,
                loss_spike=None if before is None or after is None else after - before,
            )
        lost.weights.clear()
        seconds = lost.seconds + time.perf_counter() - t0
        self.seconds += seconds
        for rec in records:
            rec.extra["accounting_seconds"] = round(seconds, 6)
