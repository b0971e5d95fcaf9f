"""The one table of setting names shared by the simulator, the swarm and the report (no torch import).

Canonical names are the simulator's strategy names (``checkfree``, ``checkfree_plus``, ``copy``, …). The authors'
names are aliases (docs/paper.md §4, §8); ``ours-grad-avg`` (and ``-regularize``) and ``ours`` depend on whether CheckFree+
swaps are on: ``run.sh`` trains with swaps, ``run_2.sh`` without, and the swarm resolves with swaps off, so its
``ours`` is CheckFree and ``ours-plus`` is CheckFree+.
"""

from __future__ import annotations

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
