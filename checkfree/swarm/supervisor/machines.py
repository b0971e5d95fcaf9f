"""The swarm's machines: their join tokens, and shutting one out while the run goes on (``swarm revoke``).

Every machine but the supervisor's own hosts one range of initial nodes through its launcher and gets its own
join token, ``<run_dir>/join_tokens/machine<START>.json`` (checkfree.swarm.wire.auth: the token holds that
machine's secret, from which only the keys of the ids the supervisor gives that machine derive).

**Revoking a machine** (a volunteer's token leaked, a machine no longer trusted): ``python -m checkfree swarm
revoke RUN_DIR START`` adds START to ``<run_dir>/revocations.json`` (written atomically); the supervisor looks at
that file about once a second while training runs (:meth:`Revocations.due`) and, for each machine listed that it
has not revoked yet (throughput.json's records, which a resumed supervisor reads back), :meth:`Revocations.revoke`:

1. revokes every id of the machine's share that can be in use (its launcher's, every node id it ever hosted, its
   window of replacement ids) in the supervisor's keyring and, through ``revoked`` in every ``peers`` and
   WELCOME, in every node's, and retires its stripe of replacement ids: a key made from its token is refused
   everywhere from now on, and messages on a connection it holds already are dropped;
2. drops its launcher (no command goes there any more; the launcher, its supervisor silent, stops its nodes after
   ``supervisor_grace``);
3. moves its slots to the supervisor's machine and marks their nodes dead (cause ``revoked: machine START``):
   the supervisor's loop replaces them there as after an eviction, recovered by the setting's rule.

It is recorded in throughput.json (``machine_revocations``) and in the journal (the slots, the revoked ids, the
record); the request file stays, and a resumed supervisor retires every listed machine's stripe before it admits
any replacement id (:func:`revoked_before`). Machines are revoked, like
evictions, only while training runs (not before it starts nor during a rollback): a request made earlier waits.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from checkfree import jsonio
from checkfree.schemas.revocations import REVOCATIONS_FORMAT
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.state import Slot, SupervisorState
from checkfree.swarm.wire.auth import Machine

log = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0
"""Seconds between two looks at the revocation requests."""


def token_path(run_dir: Path, start: int) -> Path:
    """Where the supervisor writes the join token of machine ``start``."""
    return Path(run_dir) / "join_tokens" / f"machine{start}.json"


def revocations_path(run_dir: Path) -> Path:
    return Path(run_dir) / "revocations.json"


def read_revocations(run_dir: Path) -> list[int]:
    """The machines (STARTs) whose revocation was asked for in ``run_dir`` ([] when none was).

    Raises:
        ValueError: the file is not what :func:`request_revocation` writes (one sentence naming the field and the
            value; checkfree.schemas.revocations).
    """
    from checkfree.schemas.errors import validate
    from checkfree.schemas.limits import load_json
    from checkfree.schemas.revocations import Revocations

    path = revocations_path(run_dir)
    try:
        data = load_json(path, "revocation requests")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ValueError(
            f"{path} cannot be read ({type(exc).__name__}); expected the file swarm revoke writes."
        ) from None
    return validate(Revocations, data, f"revocation requests {path}").machines


def revoked_before(run_dir: Path) -> set[int]:
    """The machines whose revocation was asked for in ``run_dir`` before this supervisor started (a resumed one
    retires their stripes before it admits any replacement id); a damaged request file is :meth:`Revocations.due`'s
    to report."""
    try:
        return set(read_revocations(run_dir))
    except ValueError:
        return set()


def request_revocation(run_dir: Path, start: int) -> bool:
    """Ask the supervisor of the run in ``run_dir`` to revoke machine ``start`` (``swarm revoke``); False when it
    was asked already.

    Raises:
        ValueError: ``start`` names no machine of the run (no join token of it), or the request file is damaged.
    """
    tokens = sorted(
        int(p.stem[len("machine") :]) for p in (Path(run_dir) / "join_tokens").glob("machine*.json")
    )
    if start not in tokens:
        raise ValueError(
            f"machine {start} is not one of the run's machines in {run_dir} (join tokens for {tokens or 'none'}); "
            "expected the START of a machine the supervisor wrote a join token for."
        )
    asked = read_revocations(run_dir)
    if start in asked:
        return False
    path = revocations_path(run_dir)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(jsonio.dumps({"format": REVOCATIONS_FORMAT, "machines": [*asked, start]}))
    os.replace(tmp, path)  # the supervisor never reads half a file
    return True


class DeathMarker(Protocol):
    """What :class:`Revocations` needs of the processes (checkfree.swarm.supervisor.processes.Processes)."""

    def mark_dead(self, slot: Slot, why: str) -> None: ...


class RevocationRecords(Protocol):
    """Where :class:`Revocations` records each machine shut out, and reads which were
    (checkfree.swarm.supervisor.results.Results; a resumed run's records are the journal's)."""

    @property
    def machine_revocations(self) -> list[dict[str, Any]]: ...

    def machine_revoked(self, record: dict[str, Any]) -> None: ...


class Revocations:
    """The machines to shut out, and shutting one out (module docstring).

    Args:
        state: the supervisor's state (its keys' machine layout, the slots, the revoked ids). link: the keyring
            and the launchers' connections. processes: marks the moved slots' nodes dead. records: where each
            revocation is recorded and read back (throughput.json's ``machine_revocations``; read at each use,
            so a resumed supervisor sees the journal's). run_dir: where the requests are.
        clock: seconds (monotonic); tests replace it.
    """

    def __init__(
        self,
        state: SupervisorState,
        link: Link,
        processes: DeathMarker,
        records: RevocationRecords,
        run_dir: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state, self.link, self.processes, self.records = state, link, processes, records
        self.run_dir, self.clock = Path(run_dir), clock
        self._looked = float("-inf")
        self._seen: tuple[int, int] | None = None
        self._complained = False

    def due(self) -> list[Machine]:
        """The machines asked to be revoked that are not yet (looks at the request file at most once per
        :data:`LOOK_EVERY_S`; a damaged file is logged once and ignored)."""
        keys = self.state.keys
        if keys is None or keys.layout is None or self.clock() - self._looked < LOOK_EVERY_S:
            return []
        self._looked = self.clock()
        try:
            st = os.stat(revocations_path(self.run_dir))
        except FileNotFoundError:
            return []
        if (st.st_mtime_ns, st.st_size) == self._seen:
            return []
        try:
            asked = read_revocations(self.run_dir)
        except ValueError as exc:
            if not self._complained:
                log.error("supervisor: revocation requests ignored: %s", exc)
                self._complained = True
            return []
        self._seen = (st.st_mtime_ns, st.st_size)
        layout = keys.layout
        out = []
        for start in asked:
            machine = layout.by_start(start)
            if machine is None or machine is layout.own:
                log.error(
                    "supervisor: revocation of machine %d ignored: no other machine of this swarm", start
                )
            elif not any(
                r["machine"] == start for r in self.records.machine_revocations
            ):  # not revoked yet (a resumed run's records)
                out.append(machine)
        return out

    def revoke(self, machine: Machine, iteration: int, now: float) -> None:
        """Shut ``machine`` out (module docstring): its ids revoked everywhere, its stripe retired, its launcher
        dropped, its slots moved to the supervisor's machine and their nodes marked dead (replaced by the loop)."""
        keys, roster = self.state.keys, self.state.roster
        assert keys is not None and keys.layout is not None
        layout = keys.layout
        ids = {machine.launcher} | {n for n in roster.by_node if machine.owns(n)}
        ids |= {n for n in layout.window(roster.next_id) if machine.owns(n)}
        layout.revoked.add(machine.start)
        for node in sorted(ids):
            roster.revoked.add(node)
            keys.revoked.add(node)
            self.link.revoke(node)
        roster.launchers.discard(machine.launcher)
        roster.launcher_addresses.pop(machine.launcher, None)
        self.link.disconnect(machine.launcher)
        moved = [s for s in roster.slots if machine.start <= s.slot < machine.end and not s.local]
        for slot in moved:
            slot.moved_here()
        self.records.machine_revoked(
            {
                "machine": machine.start,
                "nodes": [machine.start, machine.end - 1],
                "revoked_ids": sorted(ids),
                "slots_moved": [s.slot for s in moved],
                "iteration": iteration,
                "t": now,
            }
        )
        log.warning(
            "supervisor: %s revoked: ids %s refused from now on; slots %s move to this machine",
            machine.describe(),
            sorted(ids),
            [s.slot for s in moved],
        )
        for slot in moved:
            if not slot.dead:
                self.processes.mark_dead(slot, f"revoked: machine {machine.start}")
        self.link.broadcast("peers", **roster.peers_fields())  # every node withdraws the revoked keys
