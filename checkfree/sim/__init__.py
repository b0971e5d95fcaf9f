"""The convergence simulator: options, preflight, run set-up and the trainer."""
