"""The swarm's recovery policy of each ``SETTING`` (docs/paper.md §2, §3, §8): a registry, not an if-chain.

A *policy* is what a setting means to the swarm: its traits, and the plan that rebuilds a lost replica or stage.
The supervisor plans, once per loss event, how each replacement rebuilds its stage
(checkfree.swarm.supervisor.planning): it asks the setting's policy, given the stages with no serving replica
(``lost``), for a :class:`~checkfree.recovery.planner.RecoveryPlan` (which stages to fetch weights from and how to
combine them) and sends it in the replacement's WELCOME; the replacement executes it and plans nothing itself
(checkfree.swarm.node.recovering). The neighbour rules come from :func:`checkfree.recovery.planner.plan`, the one
planner the simulator uses too; the math is shared as well (checkfree.recovery.math). Each policy's flags
(``loses_state``, ``swaps``, ``keeps_stage0_copy``, ``rollback_on_stage_loss``) come from the one table of settings,
:data:`checkfree.settings.TRAITS`, that the simulator's strategies read too.

| setting | a replica of my stage serves | my whole stage is lost |
|---|---|---|
| ``no_failure`` | nobody is killed (the schedule is logged only) | — |
| ``checkpoint`` | copy the replica (weights + Adam state) | every node rolls back to the storage checkpoint |
| ``ours`` (CheckFree) | copy the replica (weights + Adam state) | CheckFree rule on both live neighbours, fresh Adam at lr × lr_scale; the first/last stage (one neighbour) copies it |
| ``ours-plus`` (CheckFree+) | copy the replica | stage 1 copies stage 2, stage S copies S−1, others as ``ours``; stage 0 loads the copies of E (held by stage 1) and E⁻¹ (held by stage S); odd microbatches run swapped |

Copying a live replica brings its Adam moments and learning rate along, so the replicas stay bit-identical
(a partial failure is lossless, docs/paper.md §1). Under ``ours-plus`` one stage-0 node pushes E to every stage-1 node
and E⁻¹ to every stage-S node after each optimizer step (STAGE0_COPY, O(|E|) traffic, docs/paper.md §3), so a lost
stage 0 comes back exactly as of the last committed iteration; a part whose holder stage is lost too gets the
simulator's seeded random init (``random_init``: run seed, iteration of the loss event, stage 0; recorded as the
plan's fallback). A holder counts only once it holds a copy (``holding``: the supervisor knows from the holders'
``committed`` reports; a holder rebuilt since stage 0 last pushed holds none), else its part takes that fallback
at once. A stage with no live transformer stage left gets the planner's "random" rule, seeded the same
way. ``ours`` cannot recover stage 0, and the run stops with that reason.
"""

from __future__ import annotations

from checkfree.recovery import planner
from checkfree.recovery.planner import RecoveryImpossible, RecoveryPlan
from checkfree.recovery.registry import resolve_setting
from checkfree.settings import HasSettingTraits

__all__ = ["POLICIES", "SwarmPolicy", "make_policy"]


class SwarmPolicy(HasSettingTraits):
    """Base: a partial failure copies a live replica; subclasses decide what a lost stage does.

    ``name`` is the canonical setting (the simulator's name; ``ours`` / ``ours-plus`` are aliases); its traits
    (:class:`checkfree.settings.SettingTraits`) are class attributes: with ``loses_state`` False (``no_failure``)
    scheduled crashes are logged but no process is killed; ``swaps``: CheckFree+ out-of-order execution on odd
    microbatches; ``rollback_on_stage_loss``: a lost stage rolls every node back to the storage checkpoint;
    ``keeps_stage0_copy``: stages 1 and S hold copies of E and E⁻¹ (docs/paper.md §3).
    """

    def plan(
        self, stage: int, lost: set[int], n_stages: int, holding: set[int] | None = None
    ) -> RecoveryPlan:
        """The plan for a replacement of ``stage`` given the stages with no serving replica (``lost``) and the
        stages whose serving replicas hold their stage-0 copy (``holding``; None: every live stage).

        Raises:
            RecoveryImpossible: the setting has no rule for this loss (e.g. stage 0 under ``ours``).
        """
        if stage not in lost:
            return RecoveryPlan("replica", (stage,), with_optimizer=True, fresh_lr_scale=False)
        return self.plan_lost(stage, lost, n_stages, holding)

    def plan_lost(
        self, stage: int, lost: set[int], n_stages: int, holding: set[int] | None = None
    ) -> RecoveryPlan:
        raise RecoveryImpossible(f"setting {self.name!r} cannot recover a lost stage {stage}.")


class NoFailurePolicy(SwarmPolicy):
    name = "no_failure"


class CheckpointPolicy(SwarmPolicy):
    name = "checkpoint"

    def plan_lost(
        self, stage: int, lost: set[int], n_stages: int, holding: set[int] | None = None
    ) -> RecoveryPlan:
        return RecoveryPlan("storage", (stage,), with_optimizer=True, fresh_lr_scale=False)


class CheckFreePolicy(SwarmPolicy):
    """CheckFree (docs/paper.md §2): the plan comes from :func:`checkfree.recovery.planner.plan`, as in the simulator."""

    name = "checkfree"

    def plan_lost(
        self, stage: int, lost: set[int], n_stages: int, holding: set[int] | None = None
    ) -> RecoveryPlan:
        live = set(range(n_stages + 1)) - set(lost)
        return planner.plan([stage], n_stages, self.name, live=live, holding=holding)[stage]


class CheckFreePlusPolicy(CheckFreePolicy):
    """CheckFree+ (docs/paper.md §3): swaps on odd microbatches; first/last stages copy their swap partner; stage 0 from
    the copies of E and E⁻¹ that stages 1 and S hold."""

    name = "checkfree_plus"


class LadderPolicy(CheckFreePlusPolicy):
    """The exactness ladder (:func:`checkfree.recovery.planner.plan_ladder`) with the rungs the swarm keeps: a
    live replica, then the CheckFree+ neighbour rule (stage 0 from the copies on stages 1 and S)."""

    name = "ladder"
    rungs = ("replica", "neighbour", "random")

    def plan(
        self, stage: int, lost: set[int], n_stages: int, holding: set[int] | None = None
    ) -> RecoveryPlan:
        live = set(range(n_stages + 1)) - set(lost)
        return planner.plan_ladder([stage], n_stages, self.rungs, live=live, holding=holding)[stage]


POLICIES: dict[str, type[SwarmPolicy]] = {
    cls.name: cls
    for cls in (NoFailurePolicy, CheckpointPolicy, CheckFreePolicy, CheckFreePlusPolicy, LadderPolicy)
}


def make_policy(setting: str) -> SwarmPolicy:
    """The policy of a ``SETTING`` name: canonical (``checkfree``, ``checkfree_plus``) or the authors' (``ours``
    = CheckFree, ``ours-plus`` = CheckFree+), resolved by the simulator's one table of names and aliases.

    Raises:
        ValueError: the name is unknown, or names a simulator strategy the swarm does not run.
    """
    canonical = resolve_setting(setting, swaps=False)
    if canonical not in POLICIES:
        raise ValueError(
            f"setting {setting!r} has no swarm implementation; expected one of no_failure, checkpoint, "
            "ours (checkfree), ours-plus (checkfree_plus), ladder."
        )
    return POLICIES[canonical]()
