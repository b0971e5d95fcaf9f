"""What a run measures and writes: metrics, monitoring, throughput and recovery accounting."""
