"""What a swarm process does when its supervisor falls silent: keep its state, do nothing else, and wait
``supervisor_grace`` seconds for a resumed supervisor before it exits (docs/swarm.md, "Resuming a run whose
supervisor died").

A supervisor that dies (its machine preempted, SIGKILL) can be resumed from its journal (``swarm run --resume
RUN_DIR``, checkfree.swarm.supervisor.journal): the resumed one binds the same address, dials every node it
journaled and asks each (CONTROL ``resume``) for its stage, the version of its weights and the attempt it was in.
Until then the node, the storage node and a launcher keep everything they hold (a node its weights, its Adam state
and, when it averaged the gradients of an attempt whose ``commit`` had not reached it, those gradients) and do
nothing else: no training without a supervisor (the node drops the attempt in flight and every peer message but
the supervisor's; its PUSH socket to the bootstrap address keeps reconnecting by itself). A process whose
supervisor stays silent ``supervisor_grace`` seconds after it noticed the silence (``peer_timeout``) exits, so no
process outlives its swarm for good.

:class:`SupervisorWatch` is that state and its clock; the processes ask it after each receive
(checkfree.swarm.node.node, checkfree.swarm.storage, checkfree.swarm.launcher).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class SupervisorWatch:
    """Whether this process's supervisor is away, since when, and whether its grace is over.

    Args:
        who: names the process in log lines ("node 7", "storage 10", "launcher 1000005").
        grace: seconds to wait for a resumed supervisor once the silence was noticed (``supervisor_grace``).
        clock: monotonic seconds; tests replace it.

    Attributes:
        away_since: when the silence was noticed (None: the supervisor is there).
        last_command_wall: epoch seconds of the supervisor's last command (what a node tells a resumed
            supervisor: the moment its predecessor was last heard of).
        dropped: peer messages dropped because the supervisor was away.
    """

    def __init__(self, who: str, grace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.who, self.grace, self.clock = who, grace, clock
        self.away_since: float | None = None
        self.last_command_wall = time.time()
        self.dropped = 0

    @property
    def away(self) -> bool:
        """The supervisor fell silent and no resumed one has spoken to this process yet."""
        return self.away_since is not None

    def heard(self) -> None:
        """A command of the supervisor was handled (call after the handler: a ``resume`` reports the one before)."""
        self.last_command_wall = time.time()

    def check(self, silent: bool) -> str:
        """After each receive: ``silent`` = the supervisor has been silent for ``peer_timeout`` seconds. Returns
        ``"lost"`` the first time (the caller drops what is in flight and keeps its state), ``"expired"`` once
        ``grace`` seconds have passed since without a resumed supervisor (the caller exits), else ``""``."""
        now = self.clock()
        if self.away_since is None:
            if not silent:
                return ""
            self.away_since = now
            log.warning(
                "%s: the supervisor has been silent for its peer timeout; keeping this process's state and waiting "
                "up to %.0f s (supervisor_grace) for a resumed supervisor (swarm run --resume)",
                self.who,
                self.grace,
            )
            return "lost"
        if now - self.away_since > self.grace:
            log.error(
                "%s: no supervisor for %.0f s (supervisor_grace); exiting", self.who, now - self.away_since
            )
            return "expired"
        return ""

    def back(self) -> None:
        """A resumed supervisor spoke to this process (its ``resume``, or for a launcher its heartbeats)."""
        if self.away_since is not None:
            log.warning(
                "%s: a resumed supervisor took over after %.1f s", self.who, self.clock() - self.away_since
            )
        self.away_since = None
