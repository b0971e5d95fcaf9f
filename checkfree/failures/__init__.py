"""Stage failures: rates, the simulator's failure sources, and schedule files."""
