"""The stage-loss probe: cells, their runs on disk, and the probe's report."""
