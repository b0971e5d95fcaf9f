"""One swarm node and its parts: pipeline driver, relay, gradient sync, copies, recovery."""
