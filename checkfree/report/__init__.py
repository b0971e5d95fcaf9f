"""``python -m checkfree report RUN_DIR... --target-loss L --out DIR``: tables, plots and the paper's orderings.

Writes ``DIR/report.md`` and PNG plots from simulator run directories (and swarm run directories holding
throughput.json): one row per run with failures, recoveries, final validation loss, iterations and simulated
hours to the target loss and the speed-up versus ``checkpoint`` on the same failures (see checkfree.report.timing for the
wall-clock model). Malformed or partial directories are reported and skipped, never fatal.
"""
