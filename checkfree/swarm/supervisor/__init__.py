"""The swarm's supervisor: roster, node processes, inbox, attempts, checkpoints, results."""
