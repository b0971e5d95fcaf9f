"""Recovery strategies, picked by name from a registry (see :mod:`checkfree.recovery.base`)."""

from checkfree.recovery import neighbours  # noqa: F401  (registers the neighbour-based strategies)
from checkfree.recovery.base import (
    ALIASES,
    REGISTRY,
    RecoveryRecord,
    RecoveryStrategy,
    make_strategy,
    register,
    resolve_setting,
)

__all__ = ["ALIASES", "REGISTRY", "RecoveryRecord", "RecoveryStrategy", "make_strategy", "register",
           "resolve_setting"]
