"""``ec_snapshot``: in-memory snapshots with one parity block (REFT, Wang et al. 2024; RAID-5 style).

Every K effective iterations (``snapshot_every``; 0 = the checkpoint baselines' default by model size), at the
iteration's start, each transformer stage 1..S keeps a snapshot of its weights, Adam state and LR multiplier in
its own memory, as one float32 vector of a layout shared by all transformer stages
(:func:`~checkfree.recovery.stage_copy.flatten`). One parity block, kept elsewhere, is their sum over GF(2) —
the bitwise XOR of the vectors' bit patterns — so decoding is bit-exact (a floating-point sum would not be).

A lost stage's own snapshot dies with it; it is decoded as parity XOR (the other stages' snapshots) and loaded,
Adam state and LR multiplier included. The stage is then stale by at most K iterations; the other stages are not
rolled back and nothing is redone. The decoded snapshot becomes the new stage's own, so the code stays complete.

Fallback (documented, logged as such): one parity block corrects one loss. With two or more transformer stages
lost in the same iteration, none can be decoded; each is rebuilt by the CheckFree rule (§4.1) from its nearest
live stages (a copy when only one side exists) with a fresh Adam at lr × lr_scale, and a new snapshot round is
taken at once (the rebuilt stages have none). Stage 0 (embedding + head)
has another shape and is outside the code: this strategy cannot recover it (``recovers_stage0`` is False).

Recorded: a "snapshot" line per round (bytes kept, parity bytes sent, stall seconds) and, in summary.json,
``extra_memory_bytes`` (S snapshots + the parity), ``parity_bytes`` (total traffic to the parity holder: S
vectors per round) and ``decode_bytes`` (traffic to rebuild lost stages: S−1 vectors + parity each).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.checkpoint import resolve_interval
from checkfree.recovery.execute import execute_local
from checkfree.recovery.math import is_consecutive
from checkfree.recovery.planner import RecoveryPlan, live_neighbours
from checkfree.recovery.record import RecoveryRecord
from checkfree.recovery.stage_copy import flatten, restore_copy, unflatten
from checkfree.training_state import TrainingState

log = logging.getLogger(__name__)


def bits(vector: torch.Tensor) -> torch.Tensor:
    """The int32 bit patterns of a float32 vector (a view, no copy)."""
    return vector.view(torch.int32)


def encode_parity(snapshots: list[torch.Tensor]) -> torch.Tensor:
    """XOR of the bit patterns of equal-length float32 vectors (an int32 vector)."""
    parity = bits(snapshots[0]).clone()
    for v in snapshots[1:]:
        parity.bitwise_xor_(bits(v))
    return parity


def decode_lost(parity: torch.Tensor, survivors: list[torch.Tensor]) -> torch.Tensor:
    """The one missing vector: parity XOR every surviving vector, as float32 (bit-exact)."""
    out = parity.clone()
    for v in survivors:
        out.bitwise_xor_(bits(v))
    return out.view(torch.float32)


class ECSnapshot(RecoveryStrategy):
    """``ec_snapshot`` (REFT-style): decode a lost stage from the others' snapshots and the parity; see module."""

    name = "ec_snapshot"

    def __init__(self, cfg, seed: int = 0):
        super().__init__(cfg, seed)
        self.every = 0
        """K: effective iterations between snapshot rounds, set by :meth:`setup`."""
        self.snapshots: dict[
            int, torch.Tensor
        ] = {}  # transformer stage → its snapshot vector (its own memory)
        self.lr_multipliers: dict[int, float] = {}
        self.parity: torch.Tensor | None = None
        self.snapshot_effective: int | None = None
        self.rounds = 0
        self.stall_seconds = 0.0
        self.parity_bytes = 0
        self.decode_bytes = 0
        self.fallbacks = 0

    def setup(self, state: TrainingState) -> None:
        self.every = resolve_interval(self.cfg.snapshot_every, state)
        log.info("ec_snapshot: a snapshot every %d iterations", self.every)

    def begin_iteration(self, state: TrainingState, failed: list[int]) -> None:
        e = state.effective_iteration
        if self.snapshot_effective is not None and (e % self.every or e == self.snapshot_effective):
            return
        self.snapshot_round(state)

    def snapshot_round(self, state: TrainingState) -> None:
        """Every transformer stage snapshots itself; the parity block is re-encoded from all of them (one
        "snapshot" line emitted)."""
        e = state.effective_iteration
        t0 = time.perf_counter()
        for s in range(1, state.n_stages + 1):
            self.snapshots[s] = flatten(state, s)
            self.lr_multipliers[s] = state.lr_multipliers[s]
        self.parity = encode_parity([self.snapshots[s] for s in sorted(self.snapshots)])
        stall = time.perf_counter() - t0
        self.snapshot_effective = e
        vec_bytes = self.parity.numel() * self.parity.element_size()
        sent = vec_bytes * state.n_stages
        self.rounds += 1
        self.stall_seconds += stall
        self.parity_bytes += sent
        self.emit(
            "snapshot",
            iteration=state.iteration,
            effective_iteration=e,
            bytes=vec_bytes * state.n_stages,
            memory_bytes=vec_bytes * (state.n_stages + 1),
            parity_bytes=sent,
            stall_seconds=round(stall, 6),
        )

    def recover(self, state: TrainingState, failed: list[int]) -> list[RecoveryRecord]:
        if 0 in failed:
            raise ValueError(
                "strategy 'ec_snapshot' cannot recover stage 0 (embedding and head): it is outside "
                "the parity group of equal-shaped transformer stages."
            )
        lost = sorted(failed)
        if len(lost) == 1:
            return [self.decode(state, lost[0])]
        records = []
        for j in lost:
            t0 = time.perf_counter()
            records.append(self._fallback(state, j, lost))
            records[-1].latency_s = time.perf_counter() - t0
            self.fallbacks += 1
        self.snapshot_round(
            state
        )  # the rebuilt stages have no snapshot: a new round makes the code complete again
        return records

    def decode(self, state: TrainingState, j: int) -> RecoveryRecord:
        t0 = time.perf_counter()
        survivors = [self.snapshots[s] for s in sorted(self.snapshots) if s != j]
        vector = decode_lost(self.parity, survivors)
        restore_copy(unflatten(vector, state, j, self.lr_multipliers[j]), state, j)
        self.snapshots[j] = vector  # the new stage now holds its snapshot again
        vec_bytes = vector.numel() * vector.element_size()
        self.decode_bytes += vec_bytes * len(survivors) + self.parity.numel() * self.parity.element_size()
        stale = state.effective_iteration - self.snapshot_effective
        return RecoveryRecord(
            j,
            "ec_decode",
            self.name,
            source_stages=sorted(s for s in self.snapshots if s != j),
            latency_s=time.perf_counter() - t0,
            extra={"snapshot_effective_iteration": self.snapshot_effective, "stale_iterations": stale},
        )

    def _fallback(self, state: TrainingState, j: int, lost: list[int]) -> RecoveryRecord:
        """Two or more lost: the CheckFree rule from the nearest live stages, fresh Adam at lr × lr_scale."""
        left, right = live_neighbours(j, lost, state.n_stages)
        sources = tuple(s for s in (left, right) if s is not None)
        if not sources:
            raise RuntimeError(f"stage {j} has no live transformer stage to fall back on (all {lost} lost).")
        rule = "copy" if len(sources) == 1 else "checkfree"
        fallback = (
            f"{len(lost)} stages lost at once (parity decodes one): {rule} rule from stages {list(sources)}"
        )
        plan = RecoveryPlan(rule, sources, fallback=fallback)
        record = execute_local(state, j, plan, self.cfg, self.seed, self.name)
        record.consecutive = is_consecutive(j, lost)
        log.info(
            "stage %d lost with %s: one parity block decodes one loss; %s rule from %s",
            j,
            lost,
            rule,
            list(sources),
        )
        return record

    def stats(self) -> dict[str, Any]:
        vec = 0 if self.parity is None else self.parity.numel() * self.parity.element_size()
        return {
            "snapshot_every": self.every,
            "snapshots": self.rounds,
            "extra_memory_bytes": vec * (len(self.snapshots) + 1),
            "parity_bytes": self.parity_bytes,
            "decode_bytes": self.decode_bytes,
            "save_stall_seconds": round(self.stall_seconds, 6),
            "fallbacks": self.fallbacks,
        }
