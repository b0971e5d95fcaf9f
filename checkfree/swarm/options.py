"""``swarm run``'s options that are not keys of the swarm config (checkfree.swarm.config.SwarmConfig): one field
each, whose type, default and docstring are its flag's (checkfree.cli_flags, checkfree.swarm.cli.add_parser).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class RunOptions:
    """What ``python -m checkfree swarm run`` accepts besides the swarm config's keys (docs/swarm.md)."""

    setting: str | None = None
    """no_failure: schedule logged, nobody killed; checkpoint: storage node + rollback; ours (= checkfree):
    CheckFree; ours-plus (= checkfree_plus): CheckFree+ (swaps on odd microbatches); ladder: a live replica, else
    the CheckFree+ rule."""
    rate: str = "16"
    """Failure rate in %/h: selects failure_p_configs/RATE.json unless ``--schedule`` is given."""
    config: str = "swarm_paper.json"
    """Swarm topology config (working directory first, then configs/)."""
    schedule: Path | None = None
    """Crash schedule in the authors' format (node id -> [crash iterations..., sentinel]), or slot down intervals
    from a preemption trace (failure_generator.py --trace; a slot stays down until it comes back); None =
    failure_p_configs/RATE.json."""
    no_schedule: bool = False
    """No crashes at all."""
    recovery_kills: Path | None = None
    """Soak runs: kills while the swarm recovers (a replacement, or the sources it fetches from), format
    checkfree-recovery-kills-v1 (checkfree/swarm/supervisor/recovery_kills.py)."""
    start: int = 0
    """First node id this machine starts (START)."""
    end: int | None = None
    """One past the last node id this machine starts (END; None = all)."""
    iterations: int = 500
    """Committed iterations to train (a replayed trace also ends with its window: throughput.json ended_by)."""
    run_dir: Path | None = None
    """Run directory (None = runs/swarm-<setting>-<rate>, -2, -3… if taken)."""
    overwrite: bool = False
    """A run directory that holds a run is moved aside to DIR.replaced-<timestamp> (nothing is deleted)."""
    bind_host: str = "127.0.0.1"
    """Interface the supervisor and nodes listen on (0.0.0.0 for a multi-machine swarm)."""
    advertise_host: str | None = None
    """Host name other machines dial (with ``--bind-host 0.0.0.0``)."""
    port: int = 0
    """Supervisor (bootstrap) port; 0 = any free port."""
    bootstrap: str | None = None
    """Join the swarm whose supervisor listens at tcp://HOST:PORT: this machine only hosts nodes START..END-1
    (multi-machine swarm; see checkfree.swarm.launcher)."""
    join_token: Path | None = None
    """Join the authenticated swarm as the machine this token is for (<run_dir>/join_tokens/machine<START>.json on
    the supervisor's machine): this machine only hosts that machine's nodes (START..END-1 default to the token's)."""
    machines: str | None = None
    """The node ranges the other machines host, each with its own join token
    (<run_dir>/join_tokens/machine<START>.json, from which only that machine's node keys derive); None = one machine
    per range of nodes outside START..END."""
    insecure: bool = False
    """No CURVE authentication or encryption (single-machine debugging only: anyone who reaches a port can then
    speak for any node)."""
    cache_dir: Path | None = None
    """Data cache (None = $CHECKFREE_CACHE or ~/.cache/checkfree)."""
    device: str = "auto"
    """Where this machine's nodes compute: auto = CUDA when torch sees a device, else the CPU; on CUDA bf16
    autocast with fp32 master weights and Adam state."""
    gpus: str | None = None
    """Comma-separated CUDA indices; this machine's k-th node uses GPU gpus[k mod len] (None = every visible GPU)."""
    dry_run: bool = False
    """Print the topology, the node -> device map and the node commands; start nothing."""
    resume: Path | None = None
    """Resume the run in RUN_DIR whose supervisor died: a new supervisor binds the same address, re-adopts the live
    nodes and goes on from the run's journal (every other option comes from the journal and may not be given)."""
