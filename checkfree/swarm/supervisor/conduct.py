"""Misbehaving members are removed: the supervisor's evidence against each node, and the eviction.

A volunteer's node holds its own key, so it passes CURVE and the sender binding (checkfree.swarm.wire.auth) and
can send anything that node could send. Every check of the swarm drops what does not fit; this module removes a
node whose messages keep being dropped, so it cannot keep the swarm busy with them.

**Evidence** (one count per rejected message, each with the time it was seen):

* *the supervisor's own verdicts*: a node's message that fails its schema (counted in the transport's
  ``validate`` hook, checkfree.swarm.wire.control.check_counting) or the supervisor's checks of its claims
  (checkfree.swarm.supervisor.inbox: a ``stalled`` before any microbatch can have timed out, a ``ready`` before
  ``sync``, a second report of one attempt, a ``replan`` for a plan never sent, …);
* *what nodes report*: every ``committed`` / ``final`` / ``stored`` carries ``rejected_from``, the messages the
  reporter refused per sender (cumulative; the increase since its last report counts), and every ``ready`` names
  the replicas whose gradients it averaged without (one count each).

A node's word about another node is evidence, not a verdict: a member could otherwise frame any other. So, per
accused node, the reports of its largest accuser are left out: one key can add nothing, and a node is accused
by reports only as far as a second reporter saw it misbehave too (our choice; an attacker holding one key
cannot produce two reporters). A node flooding one peer only is therefore not evicted on that peer's word; its
messages are still dropped there, and the bounded buffers keep the flood harmless.

**Verdict** (:meth:`Conduct.verdicts`; the supervisor evicts). A node is evicted once more than :data:`EVICT_THRESHOLD` rejected messages counted within the
last :data:`EVICT_WINDOW_S` seconds (our choice: an honest node sees a few rejections at most, a late answer
or a message of an attempt that was just aborted, and a flood is hundreds a second). The supervisor then:

1. revokes its key in its own keyring and in the swarm keys (checkfree.swarm.wire.auth: every message on a
   connection the node holds is dropped from now on, and its next handshake is refused), and in every node's
   keyring (``revoked`` in every ``peers`` and WELCOME from now on; a revoked id is never admitted again);
2. if it occupies a slot, kills it by pid (or through its launcher) and replaces it as if it had crashed:
   the crash record's cause (throughput.json ``crashes``) starts with ``evicted:``.

Each eviction is recorded (node, slot, stage, iteration, time, cause, evidence: the supervisor's count and each
reporter's) in throughput.json's ``evictions``. Launchers and the storage node are never evicted (the storage
node restarts under its own id), nor is anyone before training starts (an initial node that fails to start is
started again under its id).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from checkfree.swarm.launcher import LAUNCHER_ID_BASE
from checkfree.swarm.supervisor.state import Roster
from checkfree.swarm.wire.protocol import SUPERVISOR_ID, Message, ProtocolError

log = logging.getLogger(__name__)

EVICT_THRESHOLD = 16
"""A node is evicted once more than this many of its messages were rejected within :data:`EVICT_WINDOW_S`."""
EVICT_WINDOW_S = 60.0
"""Seconds over which rejected messages are counted."""


class Conduct:
    """The evidence against each node, and which nodes are over the threshold.

    Args:
        roster: the slots (the revoked ids, the storage node, whom a node occupies).
        threshold, window_s: the verdict's limit (:data:`EVICT_THRESHOLD`, :data:`EVICT_WINDOW_S`).
        clock: seconds (monotonic); tests replace it.
    """

    def __init__(
        self,
        roster: Roster,
        threshold: int = EVICT_THRESHOLD,
        window_s: float = EVICT_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.roster = roster
        self.threshold, self.window_s, self.clock = threshold, window_s, clock
        self._lock = threading.Lock()  # offences also arrive from the transport's receiving thread
        self._events: dict[int, deque[tuple[float, int, int]]] = {}
        """Accused node → (time, reporter (-1: the supervisor itself), count), oldest first."""
        self._last_why: dict[int, str] = {}
        self._reported: dict[int, dict[int, int]] = {}
        """Reporter → sender → the cumulative count it last reported."""

    # ------------------------------------------------------------------ evidence

    def offence(self, node: int, why: str) -> None:
        """The supervisor rejected a message of ``node`` (thread-safe)."""
        self._add(node, SUPERVISOR_ID, 1, why)

    def refused(self, msg: Message, exc: ProtocolError) -> None:
        """The transport refused ``msg`` (its schema); the ``validate`` hook's callback."""
        self.offence(msg.sender, f"a {msg.type.name} that fails its schema ({exc})")

    def reported(self, reporter: int, rejected_from: dict[str, int]) -> None:
        """A node's cumulative ``rejected_from`` (sender → messages it refused): the increase since its last
        report is evidence against each sender."""
        last = self._reported.setdefault(reporter, {})
        for key, total in rejected_from.items():
            sender = int(key)
            new, last[sender] = total - last.get(sender, 0), max(total, last.get(sender, 0))
            if new > 0:
                self._add(sender, reporter, new, f"{new} message(s) refused by node {reporter}")

    def accused(self, reporter: int, replicas: list[int]) -> None:
        """A ``ready`` of ``reporter`` names replicas whose gradients it averaged without."""
        for replica in replicas:
            self._add(replica, reporter, 1, f"gradients dropped by node {reporter}")

    def _add(self, node: int, reporter: int, count: int, why: str) -> None:
        if node == reporter or node < 0 or node >= LAUNCHER_ID_BASE:
            return  # the supervisor, launchers and a node's word about itself are not accused
        with self._lock:
            self._events.setdefault(node, deque()).append((self.clock(), reporter, count))
            self._last_why[node] = why

    def evidence(self, node: int) -> tuple[int, dict[int, int]]:
        """The supervisor's own count against ``node`` and each reporter's, within the window."""
        cutoff = self.clock() - self.window_s
        own, by = 0, {}
        with self._lock:
            events = self._events.get(node, deque())
            while events and events[0][0] < cutoff:
                events.popleft()
            for _, reporter, count in events:
                if reporter == SUPERVISOR_ID:
                    own += count
                else:
                    by[reporter] = by.get(reporter, 0) + count
        return own, by

    def score(self, node: int) -> int:
        """Rejected messages of ``node`` within the window: the supervisor's own, plus the reports of every
        reporter but its largest accuser."""
        own, by = self.evidence(node)
        return own + sum(by.values()) - max(by.values(), default=0)

    # ------------------------------------------------------------------ verdict

    def verdicts(self) -> list[int]:
        """The nodes to evict now: over the threshold, not revoked yet, not the storage node (it restarts under
        its own id). The supervisor asks after each poll once training started, and evicts them."""
        with self._lock:
            accused = [n for n in self._events if n not in self.roster.revoked]
        out = []
        for node in accused:
            slot = self.roster.by_node.get(node)
            if self.score(node) > self.threshold and (slot is None or slot is not self.roster.storage):
                out.append(node)
        return out

    def cause(self, node: int) -> tuple[str, int, dict[int, int]]:
        """Why ``node`` is evicted (one sentence), the supervisor's own count and each reporter's."""
        own, by = self.evidence(node)
        cause = (
            f"more than {self.threshold} rejected messages within {self.window_s:.0f} s ({own} rejected by the "
            f"supervisor, {sum(by.values())} reported by nodes {sorted(by)}); last: {self._last_why.get(node)}"
        )
        return cause, own, by
