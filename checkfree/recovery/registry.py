"""The registry of the simulator's recovery strategies: every strategy class, by canonical name.

The authors' setting names (``ours-grad-avg``, ``ours-naive``, …) are aliases (:mod:`checkfree.settings`).
Adding a strategy = one class in its module + one entry in :data:`REGISTRY` + its traits in
:data:`checkfree.settings.TRAITS` + its tests.
"""

from __future__ import annotations

from checkfree.config import Config
from checkfree.recovery.base import RecoveryStrategy
from checkfree.recovery.checkpoint import Checkpoint, One
from checkfree.recovery.ec_snapshot import ECSnapshot
from checkfree.recovery.ladder import Ladder
from checkfree.recovery.neighbours import Average, CheckFree, CheckFreePlus, Copy, NoFailure, RandomInit, Zero
from checkfree.recovery.redundant import Redundant
from checkfree.settings import ALIASES, SWAP_DEPENDENT, TRAITS, canonical_name

STRATEGY_CLASSES: tuple[type[RecoveryStrategy], ...] = (
    NoFailure,
    CheckFree,
    CheckFreePlus,
    Copy,
    Average,
    Zero,
    RandomInit,
    Checkpoint,
    One,
    Redundant,
    ECSnapshot,
    Ladder,
)
REGISTRY: dict[str, type[RecoveryStrategy]] = {cls.name: cls for cls in STRATEGY_CLASSES}
"""Canonical name → strategy class."""
if set(REGISTRY) != set(TRAITS):
    raise RuntimeError(
        f"checkfree.settings.TRAITS and REGISTRY name different settings: {sorted(set(REGISTRY) ^ set(TRAITS))}."
    )


def resolve_setting(setting: str, swaps: bool) -> str:
    """Canonical strategy name for a SETTING argument.

    ``ours-grad-avg`` (and ``ours-grad-avg-regularize``, identical in the authors' code) means CheckFree+ when the
    launcher runs with swaps (run.sh) and CheckFree without (run_2.sh).

    Raises:
        ValueError: the name is unknown (the sentence lists the valid names).
    """
    name = canonical_name(setting, swaps)
    if name not in REGISTRY:
        valid = sorted(REGISTRY) + sorted(ALIASES) + sorted(SWAP_DEPENDENT)
        raise ValueError(f"unknown setting {setting!r}; expected one of: {', '.join(valid)}.")
    return name


def make_strategy(setting: str, cfg: Config, swaps: bool, seed: int = 0) -> RecoveryStrategy:
    """Instantiate the strategy for ``setting`` (see :func:`resolve_setting`).

    Raises:
        ValueError: unknown setting, or a strategy that needs swaps asked for without them.
    """
    name = resolve_setting(setting, swaps)
    cls = REGISTRY[name]
    if cls.swaps and not swaps:
        raise ValueError(
            f"strategy {name!r} needs CheckFree+ swaps; run it with run.sh (or --swaps), not run_2.sh."
        )
    return cls(cfg, seed=seed)
