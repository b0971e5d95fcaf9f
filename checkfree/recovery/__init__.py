"""Recovery of lost stages: the planner, the one table of rules and the one record (shared by the simulator and the
swarm), and the simulator's strategies, picked by name from a registry (see :mod:`checkfree.recovery.base`)."""
