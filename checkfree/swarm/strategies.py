"""How a swarm node recovers its stage, per ``SETTING`` (SPEC §2, §3, §8); a registry, not an if-chain.

A replacement node learns which stages have no serving replica (``lost``) and asks its setting for a
:class:`RecoveryPlan`: which stages to fetch weights from and how to combine them. The math itself is
``checkfree.recovery.neighbours`` (``weighted_average``, ``copy_state``), shared with the simulator.

| setting | a replica of my stage serves | my whole stage is lost |
|---|---|---|
| ``no_failure`` | nobody is killed (the schedule is logged only) | — |
| ``checkpoint`` | copy the replica (weights + Adam state) | every node rolls back to the storage checkpoint |
| ``ours`` (CheckFree) | copy the replica (weights + Adam state) | CheckFree rule on both live neighbours, fresh Adam at lr × lr_scale; the first/last stage (one neighbour) copies it |
| ``ours-plus`` (CheckFree+) | copy the replica | stage 1 copies stage 2, stage S copies S−1, others as ``ours``; stage 0 loads the copies of E (held by stage 1) and E⁻¹ (held by stage S); odd microbatches run swapped |

Copying a live replica brings its Adam moments and learning rate along, so the replicas stay bit-identical
(a partial failure is lossless, SPEC §1). Under ``ours-plus`` one stage-0 node pushes E to every stage-1 node
and E⁻¹ to every stage-S node after each optimizer step (STAGE0_COPY, O(|E|) traffic, SPEC §3), so a lost
stage 0 comes back exactly as of the last committed iteration; a part whose holder stage is lost too keeps the
replacement's fresh initialisation (recorded as the plan's fallback), as in the simulator. ``ours`` cannot
recover stage 0, and the run stops with that reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from checkfree.recovery.neighbours import live_neighbours, stage0_copy_holders


class RecoveryImpossible(ValueError):
    """The setting cannot recover this stage (the message names the stage and why)."""


@dataclass
class RecoveryPlan:
    """What a replacement fetches and how it combines it.

    Attributes:
        rule: "replica" (copy a live same-stage replica), "checkfree" (weighted average of two neighbours),
            "copy" (copy one neighbour stage), "storage" (load the checkpoint), "stage0_copy" (load E and E⁻¹
            from the copies that stages 1 and S hold, CheckFree+).
        stages: source stages, in combination order (left, right for "checkfree").
        parts: for "stage0_copy", the copy asked of each source stage ("embedding" or "head").
        with_optimizer: fetch and load the source's Adam state and lr (exact copies).
        fresh_lr_scale: a fresh Adam at lr × lr_scale (neighbour rules, SPEC §2).
        fallback: why a simpler rule than intended was used, or None.
    """

    rule: str
    stages: list[int] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    with_optimizer: bool = False
    fresh_lr_scale: bool = False
    fallback: str | None = None


class SwarmRecovery:
    """Base: a partial failure copies a live replica; subclasses decide what a lost stage does."""

    name = ""
    kills = True
    """False: scheduled crashes are logged but no process is killed (``no_failure``)."""
    swaps = False
    """CheckFree+ out-of-order execution on odd microbatches (checkfree.pipeline.stage_order)."""
    rollback_on_stage_loss = False
    """A lost stage rolls every node back to the last checkpoint (the checkpoint baseline, SPEC §5)."""
    keeps_stage0_copy = False
    """Stage 1 and stage S hold copies of E and E⁻¹, refreshed after every step (CheckFree+, SPEC §3)."""

    def plan(self, stage: int, lost: set[int], n_stages: int) -> RecoveryPlan:
        """The plan for a replacement of ``stage`` given the stages with no serving replica.

        Raises:
            RecoveryImpossible: the setting has no rule for this loss (e.g. stage 0 under ``ours``).
        """
        if stage not in lost:
            return RecoveryPlan("replica", [stage], with_optimizer=True)
        return self.plan_lost(stage, lost, n_stages)

    def plan_lost(self, stage: int, lost: set[int], n_stages: int) -> RecoveryPlan:
        raise RecoveryImpossible(f"setting {self.name!r} cannot recover a lost stage {stage}.")


class NoFailure(SwarmRecovery):
    name = "no_failure"
    kills = False


class Checkpoint(SwarmRecovery):
    name = "checkpoint"
    rollback_on_stage_loss = True

    def plan_lost(self, stage: int, lost: set[int], n_stages: int) -> RecoveryPlan:
        return RecoveryPlan("storage", [stage], with_optimizer=True)


class Ours(SwarmRecovery):
    """CheckFree (SPEC §2)."""

    name = "ours"

    def plan_lost(self, stage: int, lost: set[int], n_stages: int) -> RecoveryPlan:
        if stage == 0:
            raise RecoveryImpossible(
                f"setting {self.name!r} cannot recover stage 0 (embedding and head) when all its replicas are "
                "lost; use the checkpoint setting or a schedule that keeps a stage-0 replica."
            )
        left, right = live_neighbours(stage, lost, n_stages)
        if left is not None and right is not None:
            return RecoveryPlan("checkfree", [left, right], fresh_lr_scale=True)
        only = left if left is not None else right
        if only is None:
            raise RecoveryImpossible(
                f"stage {stage} lost every transformer neighbour; nothing to recover from."
            )
        return RecoveryPlan("copy", [only], fresh_lr_scale=True, fallback="single live neighbour: copy")


class OursPlus(Ours):
    """CheckFree+ (SPEC §3): swaps on odd microbatches; first/last stages copy their swap partner."""

    name = "ours-plus"
    swaps = True
    keeps_stage0_copy = True

    def plan_lost(self, stage: int, lost: set[int], n_stages: int) -> RecoveryPlan:
        if stage == 0:
            holders = stage0_copy_holders(n_stages)
            kept = [part for part in holders if holders[part] not in lost]
            gone = [part for part in holders if part not in kept]
            return RecoveryPlan(
                "stage0_copy",
                [holders[p] for p in kept],
                parts=kept,
                fresh_lr_scale=True,
                fallback=f"copy holder lost too: fresh init of {gone}" if gone else None,
            )
        partner = {1: 2, n_stages: n_stages - 1}.get(stage)
        if partner is not None and partner >= 1 and partner not in lost:
            return RecoveryPlan("copy", [partner], fresh_lr_scale=True)
        return super().plan_lost(stage, lost, n_stages)


STRATEGIES: dict[str, type[SwarmRecovery]] = {
    cls.name: cls for cls in (NoFailure, Checkpoint, Ours, OursPlus)
}


def make_recovery(setting: str) -> SwarmRecovery:
    """The strategy of a ``SETTING`` name.

    Raises:
        ValueError: the name is unknown.
    """
    try:
        return STRATEGIES[setting]()
    except KeyError:
        raise ValueError(f"setting {setting!r} is unknown; expected one of {sorted(STRATEGIES)}.") from None
