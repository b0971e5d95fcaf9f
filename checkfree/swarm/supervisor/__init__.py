"""The swarm's supervisor: one loop over explicit phases (phases/), its state, roster, node processes, inbox, attempts,
checkpoints, results."""
