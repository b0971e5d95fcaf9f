"""The one table of settings shared by the simulator, the swarm and the report (no torch import): names and traits.

Canonical names are the simulator's strategy names (``checkfree``, ``checkfree_plus``, ``copy``, …). The authors'
names are aliases (docs/paper.md §4, §8); ``ours-grad-avg`` (and ``-regularize``) and ``ours`` depend on whether CheckFree+
swaps are on: ``run.sh`` trains with swaps, ``run_2.sh`` without, and the swarm resolves with swaps off, so its
``ours`` is CheckFree and ``ours-plus`` is CheckFree+.

:data:`TRAITS` says what each canonical setting does, once: the simulator's strategies
(:class:`checkfree.recovery.base.RecoveryStrategy`) and the swarm's policies
(:class:`checkfree.swarm.policies.SwarmPolicy`) both take their flags from it (:class:`HasSettingTraits`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

ALIASES: dict[str, str] = {
    "ours-naive": "copy",
    "ours-random": "random",
    "ours-zero": "zero",
    "ours-avg-ablation": "average",
    "whole_model": "checkpoint",
    "ours-plus": "checkfree_plus",
}
SWAP_DEPENDENT = frozenset({"ours-grad-avg", "ours-grad-avg-regularize", "ours"})


def canonical_name(setting: str, swaps: bool) -> str:
    """The canonical name of ``setting`` (unchanged when it is not an alias; validity is the registry's call)."""
    if setting in SWAP_DEPENDENT:
        return "checkfree_plus" if swaps else "checkfree"
    return ALIASES.get(setting, setting)


@dataclass(frozen=True)
class SettingTraits:
    """What one canonical setting does, in the simulator and in the swarm alike."""

    loses_state: bool = True
    """A failure destroys the stage. False only for ``no_failure``: failures are drawn and logged, the simulator
    loses nothing and the swarm kills no process (the reference curve, docs/paper.md §6)."""
    swaps: bool = False
    """Runs CheckFree+ out-of-order execution on odd microbatches (paper §4.2, checkfree.pipeline.stage_order); the
    simulator refuses such a setting without swaps (run.sh, not run_2.sh)."""
    recovers_stage0: bool = False
    """A lost stage 0 (embedding + head) can be rebuilt (CheckFree+ from its copies, or a checkpoint or replica)."""
    keeps_stage0_copy: bool = False
    """Stage 1 and stage S hold copies of E and E⁻¹, refreshed after every step (CheckFree+, paper §4.2,
    docs/paper.md §3)."""
    rollback_on_stage_loss: bool = False
    """A lost stage rolls every stage back to the last checkpoint (the checkpoint baseline, docs/paper.md §5); the
    simulator then estimates the run's wall-clock length (checkfree.sim.progress)."""


_CHECKFREE_PLUS = SettingTraits(swaps=True, recovers_stage0=True, keeps_stage0_copy=True)
TRAITS: dict[str, SettingTraits] = {
    "no_failure": SettingTraits(loses_state=False, recovers_stage0=True),
    "checkfree": SettingTraits(),
    "checkfree_plus": _CHECKFREE_PLUS,
    "copy": SettingTraits(),
    "average": SettingTraits(),
    "zero": SettingTraits(),
    "random": SettingTraits(),
    "checkpoint": SettingTraits(recovers_stage0=True, rollback_on_stage_loss=True),
    "one": SettingTraits(recovers_stage0=True),
    "redundant": SettingTraits(recovers_stage0=True),
    "ec_snapshot": SettingTraits(),
    "ladder": _CHECKFREE_PLUS,
}
"""Canonical setting → its traits (checkfree/recovery/registry.py and checkfree/swarm/policies.py implement them).
``ladder`` runs CheckFree+ (its neighbour rung), so it shares CheckFree+'s traits."""

_DEFAULT = SettingTraits()


class HasSettingTraits:
    """Base of a class implementing one canonical setting: the fields of ``TRAITS[name]`` become its class
    attributes (``loses_state``, ``swaps``, ``recovers_stage0``, ``keeps_stage0_copy``, ``rollback_on_stage_loss``).

    A subclass whose ``name`` has no entry (a test double, an abstract helper) keeps its parent's traits.
    """

    name: ClassVar[str] = ""
    loses_state: ClassVar[bool] = _DEFAULT.loses_state
    swaps: ClassVar[bool] = _DEFAULT.swaps
    recovers_stage0: ClassVar[bool] = _DEFAULT.recovers_stage0
    keeps_stage0_copy: ClassVar[bool] = _DEFAULT.keeps_stage0_copy
    rollback_on_stage_loss: ClassVar[bool] = _DEFAULT.rollback_on_stage_loss

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        traits = TRAITS.get(cls.name)
        if traits is not None:
            for f in dataclasses.fields(SettingTraits):
                setattr(cls, f.name, getattr(traits, f.name))
