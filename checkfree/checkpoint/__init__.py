"""Run checkpoints on disk: the universal format, and the writer of the checkpoint baselines."""
