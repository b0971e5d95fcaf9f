"""Recovery strategies, picked by name from a registry (see :mod:`checkfree.recovery.base`)."""

from checkfree.recovery import (  # noqa: F401  (importing registers the strategies)
    checkpoint,
    ec_snapshot,
    ladder,
    neighbours,
    redundant,
)
from checkfree.recovery.base import (
    ALIASES,
    REGISTRY,
    RecoveryRecord,
    RecoveryStrategy,
    make_strategy,
    register,
    resolve_setting,
)

__all__ = [
    "ALIASES",
    "REGISTRY",
    "RecoveryRecord",
    "RecoveryStrategy",
    "make_strategy",
    "register",
    "resolve_setting",
]
