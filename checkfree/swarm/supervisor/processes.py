"""The supervisor's node processes: starting them, noticing their deaths, replacing them.

A node is started here (``LocalHost``) or by another machine's launcher (a ``spawn`` command). It is dead when
its process exited, it fell silent for ``peer_timeout`` seconds, it did not serve within ``recovery_timeout``
of its start (then it is killed), or it reported that its recovery failed. A dead slot gets a replacement with
a fresh node id of its machine's share (admitted to the keyring before it dials; checkfree.swarm.wire.auth), at
most ``max_attempts`` times per slot. Processes
are killed by pid only.

:class:`Processes` acts and answers at once; it waits for nothing (the supervisor's loop does) and records a crash's
events in a :class:`CrashLedger` (checkfree.swarm.supervisor.results).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.state import Slot, SupervisorState, SwarmError

log = logging.getLogger(__name__)


class CrashLedger(Protocol):
    """Where a crash's events are recorded (checkfree.swarm.supervisor.results.Results)."""

    def spawned(self, slot: Slot) -> None: ...

    def crashed(self, slot: Slot, cause: str, iteration: int) -> None: ...

    def forget_crash(self, slot: Slot) -> None: ...


class JournalWriter(Protocol):
    """Where the supervisor's state is journaled (checkfree.swarm.supervisor.journal.Journal)."""

    def write(self, why: str) -> None: ...


class Processes:
    """Starts, watches and replaces the swarm's node processes.

    Args:
        state: the supervisor's state (the config, the slots, the keys, the storage node's checkpoints, which
            die with it). link: messages to nodes (and the transport). host: starts and kills this machine's
            processes. ledger: records a crash's events. bootstrap: the supervisor's address (named in the
            error for slots no launcher took). journal: written before a node starts (its id is never handed out
            twice) and once it runs (its pid and start time: a resumed supervisor signals only it).
    """

    def __init__(
        self,
        state: SupervisorState,
        link: Link,
        host: LocalHost,
        ledger: CrashLedger,
        bootstrap: str,
        journal: JournalWriter | None = None,
    ) -> None:
        self.state, self.link, self.host, self.ledger, self.bootstrap = state, link, host, ledger, bootstrap
        self.journal = journal
        self.cfg: SwarmConfig = state.cfg
        self.roster, self.keys = state.roster, state.keys
        self.deaths = 0
        """Stage nodes found dead since the last :meth:`check_deaths`."""
        self.t_created = time.monotonic()
        self.admit_window()

    def admit_window(self) -> None:
        """Admit each machine's next KEY_WINDOW replacement ids (they get their keys before they dial)."""
        if self.keys is not None:
            self.link.admit(self.keys.admitted([], self.roster.next_id, self.roster.revoked))

    def admitted(self) -> dict[int, str]:
        """The public keys a node admits from its start (its key file): every occupant and each machine's next
        replacement ids (checkfree.swarm.wire.auth ``SwarmKeys.admitted``); none with plain TCP."""
        if self.keys is None:
            return {}
        occupants = [s.occupant for s in self.roster.all()]
        return self.keys.admitted(occupants, self.roster.next_id, self.roster.revoked)

    def replacement_id(self, slot: Slot) -> int:
        """A fresh id for a replacement of ``slot``: the next of its machine's share (checkfree.swarm.wire.auth
        ``MachineLayout``; plain TCP: the next id), never an evicted one (a key misused ahead of its spawn)."""
        roster = self.roster
        layout = self.keys.layout if self.keys is not None else None
        if layout is None:
            node = roster.next_id
            while node in roster.revoked:
                node += 1
            return node
        machine = layout.own if slot.local else layout.machine_of(slot.slot)
        return layout.replacement_id(machine, roster.next_id, roster.revoked)

    def spawn(self, slot: Slot, replacement: bool) -> None:
        """Start ``slot``'s node (a replacement gets a fresh id).

        Raises:
            SwarmError: the slot failed to start or recover ``max_attempts`` times.
        """
        roster = self.roster
        tries = slot.start_counted()
        if tries > self.cfg.max_attempts:
            raise SwarmError(
                f"slot {slot.slot} (stage {slot.stage}) failed to start or recover {tries - 1} times; giving up."
            )
        occupant = slot.occupant
        if replacement:
            occupant = self.replacement_id(slot)
            roster.next_id = occupant + 1
            self.admit_window()
        slot.started(occupant, time.monotonic() + self.cfg.recovery_timeout)
        roster.by_node[slot.occupant] = slot
        if self.journal is not None:
            self.journal.write(f"starting node {slot.occupant}")
        if slot.local:
            self.host.spawn(slot.occupant, slot.stage, slot.location, replacement, self.admitted())
            if self.journal is not None:
                self.journal.write(f"started node {slot.occupant}")
        elif slot.launcher is not None:
            self.link.command(
                slot.launcher,
                "spawn",
                node=slot.occupant,
                stage=slot.stage,
                location=slot.location,
                replacement=replacement,
                keys={str(n): key for n, key in self.admitted().items()},
            )
        self.ledger.spawned(slot)

    def kill(self, slot: Slot, why: str, tell_peers: bool = True) -> None:
        """SIGKILL ``slot``'s occupant (here, or through its launcher) and mark it dead."""
        if slot.local:
            self.host.kill(slot.occupant)
        elif slot.launcher is not None:
            self.link.command(slot.launcher, "kill", node=slot.occupant)
        self.mark_dead(slot, why, tell_peers)

    def mark_dead(self, slot: Slot, why: str, tell_peers: bool = True) -> None:
        """Record ``slot``'s occupant as gone (once): a crash record, the storage's checkpoints forgotten,
        the peer table re-broadcast (unless ``tell_peers`` is False: a resumed supervisor tells them once)."""
        if slot.dead:
            return
        log.warning(
            "supervisor: node %d (slot %d, stage %d) is gone: %s", slot.occupant, slot.slot, slot.stage, why
        )
        slot.died()
        is_storage = slot is self.roster.storage
        self.deaths += not is_storage
        if is_storage:
            self.state.checkpoints.forget(self.state.begun_iteration)
        self.ledger.crashed(slot, why, self.state.begun_iteration)
        self.link.disconnect(slot.occupant)
        if tell_peers:
            self.link.broadcast("peers", **self.roster.peers_fields())

    def check_deaths(self) -> bool:
        """Mark exited or silent processes dead; True if a stage node died since the last call."""
        silent = self.link.silent()
        failed = self.state.reports.recovery_failed
        for slot in self.roster.all():
            if slot.dead:
                continue
            exited = self.host.exited(slot.occupant) if slot.local else None
            if exited is not None:
                self.mark_dead(slot, f"process exited with code {exited}")
            elif slot.address is not None and slot.occupant in silent:
                self.mark_dead(slot, f"silent for {self.cfg.peer_timeout:.1f} s")
            elif not slot.serving and time.monotonic() > slot.deadline and (slot.local or slot.launcher):
                self.kill(slot, f"not serving within {self.cfg.recovery_timeout:.0f} s")
            elif slot.occupant in failed:
                failed.pop(slot.occupant)
                self.kill(slot, "its recovery failed")
        died, self.deaths = self.deaths > 0, 0
        return died

    def replace_dead(self, initial: bool = False) -> None:
        """Start a node for every dead slot the schedule does not keep away (here, or through its launcher): a
        replacement with a fresh id, or, on the ``initial`` start, the same node again (a node that failed to start
        is no crash: its record is dropped). The storage node restarts under its own id.

        Raises:
            SwarmError: a slot failed ``max_attempts`` times, or no launcher took the remote slots in time.
        """
        roster = self.roster
        orphans = [s.slot for s in roster.slots if not s.local and s.launcher is None]
        if orphans and time.monotonic() - self.t_created > self.cfg.recovery_timeout:
            raise SwarmError(
                f"no launcher took nodes {orphans} within {self.cfg.recovery_timeout:.0f} s; start "
                f"them with run_throughput.sh START END ... --bootstrap {self.bootstrap}."
            )
        for slot in roster.all():
            if slot.dead and not slot.away and (slot.local or slot.launcher is not None):
                if initial:
                    self.ledger.forget_crash(slot)  # an initial node that failed to start: a plain retry
                    slot.start_retried()
                self.spawn(slot, replacement=not initial and slot is not roster.storage)
