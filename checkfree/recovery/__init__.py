"""Recovery strategies, picked by name from a registry (see :mod:`checkfree.recovery.base`)."""
