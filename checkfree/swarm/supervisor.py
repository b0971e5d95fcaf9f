"""The supervisor: bootstrap/rendezvous, iteration coordinator, crash replayer, result collector (SPEC §8).

It starts one process per *slot* (initial node ids START..END−1; a slot = a stage replica at a location),
plus the storage node for ``checkpoint``. Each node JOINs at the supervisor's address (the bootstrap), gets
WELCOME (config, peers) and the others get the new peer table. Then, per iteration, one *epoch* per attempt:

    begin(epoch, members) → stage-0 nodes run their pipelines → ITERATION_END from every pipeline
    → sync → every node averages its stage's gradients with its replicas → ready (grad norm)
    → commit → Adam step → committed (stats)        — the commit time is the aggregation timestamp

**Crashes.** ``failure_p_configs/RATE.json`` lists, per initial node id (= slot), the iterations in which it
crashes. During the first attempt of iteration i, ``crash_point`` × (last iteration time) seconds after
``begin`` — microbatches are then in flight — the supervisor SIGKILLs the slot's current process (all
replicas of a stage at once when the schedule says so: a whole-stage failure), or at the latest when the
attempt reaches ``sync``. ``no_failure`` logs the scheduled crashes and kills nobody.

**In-flight microbatches.** A death noticed before ``commit`` aborts the epoch everywhere (``abort``): every
node drops that epoch's activations and accumulated gradients, and stale messages are dropped by their epoch.
No optimizer has stepped before ``commit``, so nothing is half-applied. The slot gets a replacement (a new
node id, same stage and location) which recovers its weights from the network per the setting
(checkfree.swarm.strategies); when every slot serves again, the same iteration is redone from microbatch 0
with the same batches (the data position is the iteration). So no microbatch is lost or counted twice.
A death after ``commit`` was broadcast no longer aborts: the survivors step, and the replacement copies
the stepped state. Under ``checkpoint``, a whole-stage loss rolls every node back to the newest checkpoint
that every stage stored, and the iterations since are redone.

**No hang.** Every wait has a deadline and a next step: attempt (``iteration_timeout``, a ``stalled``
report) → abort and redo, at most ``max_attempts`` times per iteration; replacement (``recovery_timeout``,
``recovery_failed``) → kill and start another, at most ``max_attempts`` times per slot; shutdown → SIGKILL.
Exceeding a limit raises :class:`SwarmError`. Every process is reaped in ``finally``; nodes exit by
themselves when the supervisor falls silent. Processes are killed by pid only.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from checkfree.swarm import control as schemas
from checkfree.swarm.auth import KEY_WINDOW, KeyRing, SwarmKeys
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.control import control
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.launcher import LAUNCHER_ID_BASE
from checkfree.swarm.protocol import SUPERVISOR_ID, Message, MessageType
from checkfree.swarm.results import Results
from checkfree.swarm.strategies import RecoveryImpossible, RecoveryPlan, make_recovery
from checkfree.swarm.supervisor_inbox import PeerMessages
from checkfree.swarm.transport import Transport, TransportError

log = logging.getLogger(__name__)

POLL_S = 0.005
SHUTDOWN_TIMEOUT_S = 15.0


class SwarmError(RuntimeError):
    """The swarm cannot make progress (a limit of retries was exceeded); the message says which."""


class Slot:
    """A stage replica's place in the swarm: an initial node id, its stage, location and current process."""

    def __init__(self, slot: int, stage: int, location: str, local: bool) -> None:
        self.slot, self.stage, self.location, self.local = slot, stage, location, local
        self.occupant = slot
        self.address: str | None = None
        self.serving = False
        self.dead = False
        self.version = 0
        self.tries = 0
        self.deadline = float("inf")
        self.crash: dict[str, Any] | None = None
        self.launcher: int | None = None
        """Id of the launcher that hosts this slot on another machine (None: local or not yet known)."""
        self.plan: RecoveryPlan | None = None
        """How this slot's replacement rebuilds its stage: planned once per loss event by the supervisor."""


class Supervisor(PeerMessages):
    """Runs a swarm to ``iterations`` committed iterations; :meth:`run` returns the throughput results.

    Args:
        cfg: the topology. setting: no_failure | checkpoint | ours | ours-plus. schedule: {node id: crash
        iterations} (checkfree.failures.load_node_schedule). run_dir: logs and throughput.json go here.
        start, end: the initial node ids this machine starts (others join from elsewhere at ``address``).
        on_recovered: called as ``on_recovered(supervisor, crash_records)`` after every recovery, while the
        swarm is paused (tests inspect weights through :meth:`fetch_weights`).
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        setting: str,
        schedule: dict[int, list[int]],
        iterations: int,
        run_dir: Path,
        vocab_size: int,
        start: int = 0,
        end: int | None = None,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        advertise_host: str | None = None,
        cache_dir: Path | None = None,
        on_recovered: Callable[[Supervisor, list[dict[str, Any]]], None] | None = None,
        insecure: bool = False,
    ) -> None:
        self.cfg, self.setting, self.iterations = cfg, setting, iterations
        self.strategy = make_recovery(setting)
        self.run_dir, self.vocab_size, self.on_recovered = Path(run_dir), vocab_size, on_recovered
        end = cfg.n_nodes if end is None else end
        if not 0 <= start < end <= cfg.n_nodes:
            raise ValueError(
                f"node range {start}..{end} is outside the swarm's 0..{cfg.n_nodes}; expected "
                f"0 <= START < END <= {cfg.n_nodes}."
            )
        bad = sorted(n for n in schedule if n >= cfg.n_nodes)
        if bad:
            raise ValueError(
                f"the schedule names node {bad[0]}, but the swarm has nodes 0..{cfg.n_nodes - 1}."
            )
        self.schedule = schedule
        table = cfg.location_table()
        self.slots = [
            Slot(n, cfg.stage_of(n), cfg.location_of(n, table), start <= n < end) for n in range(cfg.n_nodes)
        ]
        self.storage = (
            Slot(cfg.storage_id, -1, cfg.storage_location, start == 0)
            if self.strategy.rollback_on_stage_loss
            else None
        )
        self.next_id = cfg.first_replacement_id
        self.keys = None if insecure else SwarmKeys.new()
        identity = None
        if self.keys is not None:
            ring = KeyRing({n: self.keys.public_key(n) for n in range(-1, cfg.first_replacement_id)})
            launchers = range(LAUNCHER_ID_BASE, LAUNCHER_ID_BASE + cfg.n_nodes)
            ring.update({n: self.keys.public_key(n) for n in launchers})
            identity = self.keys.identity(SUPERVISOR_ID, ring)
        self.transport = Transport(
            SUPERVISOR_ID,
            bind_host=bind_host,
            port=port,
            heartbeat_interval=cfg.heartbeat_interval,
            peer_timeout=cfg.peer_timeout,
            identity=identity,
            validate=schemas.check,
        )
        self._admit_window()
        self.address = self.transport.address
        if advertise_host:
            self.address = f"tcp://{advertise_host}:{self.address.rsplit(':', 1)[1]}"
        self.host = LocalHost(
            self.run_dir, self.address, bind_host, advertise_host, cache_dir, keys=self.keys
        )
        self.by_node: dict[int, Slot] = {}
        self.launchers: set[int] = set()
        self.t_created = time.monotonic()
        self.bad_messages = 0
        """Peer messages that passed the wire format and schema but did not fit (dropped, counted)."""
        self.epoch = 0
        self.deaths = 0
        self.fired: set[tuple[int, int]] = set()
        self.stored: dict[int, set[int]] = {}
        self.storage_lost_at: int | None = None
        """The iteration during which the storage node died (its checkpoints went with it), or None."""
        self.inbox: dict[str, dict[int, dict[str, Any]]] = {}
        self.results = Results(cfg, setting, iterations)
        self.results.vocab_size = vocab_size
        self.node_handlers: dict[MessageType, Callable[[Slot, Message], None]] = {
            MessageType.ITERATION_END: self._on_iteration_end,
            MessageType.CONTROL: self._on_node_control,
        }
        """Message type (from a slot's occupant) → handler; JOIN and launchers are routed before."""
        self.node_commands: dict[str, Callable[[Slot, dict[str, Any]], None]] = {
            "serving": self._on_serving,
            "stored": self._on_stored,
            "committed": self._on_report,
            "final": self._on_report,
            "restored": self._on_restored,
            "ready": self._to_inbox,
            "stalled": self._to_inbox,
            "recovery_failed": self._to_inbox,
        }
        """CONTROL command from a node → handler."""

    @property
    def token_path(self) -> Path:
        """The join token other machines' launchers need (written by :meth:`run`; absent with ``insecure``)."""
        return self.run_dir / "join_token.json"

    def _admit_window(self) -> None:
        """Admit the next KEY_WINDOW replacement ids (they get their keys before they dial)."""
        if self.keys is not None and self.transport.identity is not None:
            ids = range(self.next_id, self.next_id + KEY_WINDOW)
            self.transport.identity.keyring.update({n: self.keys.public_key(n) for n in ids})

    # ------------------------------------------------------------------ public

    def run(self) -> dict[str, Any]:
        """Start, train, shut down; returns (and writes) the throughput results.

        Raises:
            SwarmError: a retry limit was exceeded, or an internal error (a bug) stopped the run: its
                traceback is appended to ``<run_dir>/supervisor.log``. Every node is reaped either way.
        """
        try:
            return self._run()
        except SwarmError:
            raise
        except Exception as exc:  # a bug: stop the run, keep the traceback, reap every node (finally below)
            with open(self.run_dir / "supervisor.log", "a") as f:
                f.write(f"internal error of the supervisor:\n{traceback.format_exc()}")
            raise SwarmError(
                f"internal error of the supervisor ({type(exc).__name__}: {exc}); traceback in "
                f"{self.run_dir / 'supervisor.log'}."
            ) from exc
        finally:
            self.host.reap_all()
            self.transport.close()

    def _run(self) -> dict[str, Any]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.keys is not None:
            self.keys.write_token(self.token_path, self.address)
        for slot in self._all_slots():
            if slot.local:
                self._spawn(slot, replacement=False)
        self._wait_serving(initial=True)
        if self.storage is not None:
            self._checkpoint_initial()
        self.results.start()
        it = 0
        while it < self.iterations:
            it = self._ensure_serving(it)
            if self._attempt(it):
                it += 1
        self._shutdown()
        return self.results.finish(self.run_dir)

    def fetch_weights(self, node: int, stage: int, timeout: float = 30.0, part: str | None = None) -> Message:
        """Ask a serving node for its stage's weights (w.* tensors, meta with grad_norm), or, with ``part``, for
        the CheckFree+ copy of stage 0's "embedding" or "head" it holds; for tests."""
        rid = secrets.token_hex(16)
        self._send(
            node,
            MessageType.WEIGHTS_REQUEST,
            {"stage": stage, "request": rid} | ({"part": part} if part else {}),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.transport.recv(0.05)
            if msg is None:
                continue
            if msg.type == MessageType.WEIGHTS_RESPONSE and msg.meta.get("request") == rid:
                return msg
            self._handle(msg)
        raise SwarmError(f"node {node} did not answer a weights request within {timeout:.0f} s.")

    def node_address(self, node: int) -> str | None:
        slot = self.by_node.get(node)
        return slot.address if slot is not None else None

    # ------------------------------------------------------------------ messaging

    def _all_slots(self) -> list[Slot]:
        return self.slots + ([self.storage] if self.storage is not None else [])

    def _send(self, node: int, mtype: MessageType, meta: dict[str, Any]) -> None:
        try:
            self.transport.send(node, Message(mtype, SUPERVISOR_ID, meta=meta))
        except TransportError as exc:
            log.warning("supervisor: could not send %s to %d: %s", mtype.name, node, exc)

    def _broadcast(self, command: str, **meta: Any) -> None:
        msg = control(command, **meta)
        for slot in self._all_slots():
            if slot.address is not None and not slot.dead:
                self._send(slot.occupant, MessageType.CONTROL, msg)

    def _members(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {s: [] for s in range(self.cfg.n_stages + 1)}
        for slot in self.slots:
            if slot.serving:
                out[slot.stage].append(slot.occupant)
        return out

    def _peer_rows(self) -> list[list[Any]]:
        return [
            [s.occupant, s.stage, s.location, s.address]
            for s in self._all_slots()
            if s.address is not None and not s.dead
        ]

    def _poll(self, timeout: float = POLL_S) -> None:
        msg = self.transport.recv(timeout)
        while msg is not None:
            self._handle(msg)
            msg = self.transport.recv(0)

    # ------------------------------------------------------------------ processes and deaths

    def _spawn(self, slot: Slot, replacement: bool) -> None:
        slot.tries += 1
        if slot.tries > self.cfg.max_attempts:
            raise SwarmError(
                f"slot {slot.slot} (stage {slot.stage}) failed to start or recover "
                f"{slot.tries - 1} times; giving up."
            )
        if replacement:
            slot.occupant, self.next_id = self.next_id, self.next_id + 1
            self._admit_window()
        slot.address, slot.serving, slot.dead = None, False, False
        slot.deadline = time.monotonic() + self.cfg.recovery_timeout
        self.by_node[slot.occupant] = slot
        if slot.local:
            self.host.spawn(slot.occupant, slot.stage, slot.location, replacement, self.next_id)
        elif slot.launcher is not None:
            spawn = control(
                "spawn",
                node=slot.occupant,
                stage=slot.stage,
                location=slot.location,
                replacement=replacement,
                admit_upto=self.next_id,
            )
            self._send(slot.launcher, MessageType.CONTROL, spawn)
        if slot.crash is not None:
            slot.crash.update(replacement_node=slot.occupant, t_spawn=self.results.now())

    def _kill(self, slot: Slot, why: str) -> None:
        if slot.local:
            self.host.kill(slot.occupant)
        elif slot.launcher is not None:
            self._send(slot.launcher, MessageType.CONTROL, control("kill", node=slot.occupant))
        self._mark_dead(slot, why)

    def _mark_dead(self, slot: Slot, why: str) -> None:
        if slot.dead:
            return
        log.warning(
            "supervisor: node %d (slot %d, stage %d) is gone: %s", slot.occupant, slot.slot, slot.stage, why
        )
        slot.dead, slot.serving = True, False
        self.deaths += slot is not self.storage
        if slot is self.storage and self.stored:
            log.warning(
                "supervisor: the storage node is gone; the checkpoints it held (%s) are lost",
                {s: sorted(v) for s, v in self.stored.items()},
            )
            self.stored.clear()
            self.storage_lost_at = self.results.current_iteration
        if slot.crash is None:
            slot.crash = {
                "slot": slot.slot,
                "node": slot.occupant,
                "stage": slot.stage,
                "cause": why,
                "t_crash": self.results.now(),
                "iteration": self.results.current_iteration,
            }
        self.transport.disconnect(slot.occupant)
        self._broadcast("peers", peers=self._peer_rows())

    def _check_deaths(self) -> bool:
        """Mark exited or silent processes dead; True if a node died since the last call."""
        silent = self.transport.dead_peers()
        for slot in self._all_slots():
            if slot.dead:
                continue
            exited = self.host.exited(slot.occupant) if slot.local else None
            if exited is not None:
                self._mark_dead(slot, f"process exited with code {exited}")
            elif slot.address is not None and slot.occupant in silent:
                self._mark_dead(slot, f"silent for {self.cfg.peer_timeout:.1f} s")
            elif not slot.serving and time.monotonic() > slot.deadline and (slot.local or slot.launcher):
                self._kill(slot, f"not serving within {self.cfg.recovery_timeout:.0f} s")
            elif slot.occupant in self.inbox.get("recovery_failed", {}):
                self.inbox["recovery_failed"].pop(slot.occupant)
                self._kill(slot, "its recovery failed")
        died, self.deaths = self.deaths > 0, 0
        return died

    def _plan_event(self) -> set[int]:
        """Plan, once for this loss event, how every slot without a serving node is rebuilt; returns the lost
        stages (no serving replica). Replacements execute these plans and never re-plan, so replicas of one
        stage lost together are rebuilt alike, whatever order they join in.

        Raises:
            SwarmError: the setting cannot recover a lost stage (e.g. stage 0 under ``ours``).
        """
        lost = {s for s in range(self.cfg.n_stages + 1) if not self._members()[s]}
        for slot in self.slots:
            if slot.serving:
                continue
            try:
                slot.plan = self.strategy.plan(slot.stage, lost, self.cfg.n_stages)
            except RecoveryImpossible as exc:
                raise SwarmError(str(exc)) from None
        return lost

    def _wait_serving(self, initial: bool = False) -> None:
        """Until every slot serves: replace dead slots (local ones), enforce deadlines; a death meanwhile is a new
        loss event, planned anew."""
        while True:
            self._poll(0.02)
            if self._check_deaths() and not initial:
                self._plan_event()
            orphans = [s.slot for s in self.slots if not s.local and s.launcher is None]
            if orphans and time.monotonic() - self.t_created > self.cfg.recovery_timeout:
                raise SwarmError(
                    f"no launcher took nodes {orphans} within {self.cfg.recovery_timeout:.0f} s; start "
                    f"them with run_throughput.sh START END ... --bootstrap {self.address}."
                )
            for slot in self._all_slots():
                if slot.dead and (slot.local or slot.launcher is not None):
                    if initial:
                        slot.crash = None  # an initial node that failed to start: a plain retry
                    self._spawn(slot, replacement=not initial and slot is not self.storage)
            if all(s.serving for s in self._all_slots()):
                return

    def _ensure_serving(self, it: int) -> int:
        """Recover every dead slot before the next attempt; returns the iteration to run (rollback!)."""
        if all(s.serving for s in self._all_slots()):
            return it
        lost = self._plan_event()
        if lost and self.strategy.rollback_on_stage_loss and not self._has_complete_checkpoint():
            cause = (
                f"the storage node restarted during iteration {self.storage_lost_at} and lost every checkpoint"
                if self.storage_lost_at is not None
                else "the storage node holds no checkpoint every stage stored"
            )
            raise SwarmError(f"stages {sorted(lost)} were lost and cannot be rolled back: {cause}.")
        pending = [dict(s.crash) for s in self.slots if s.crash is not None]
        self._wait_serving()
        if lost and self.strategy.rollback_on_stage_loss:
            version = self._complete_checkpoint()
            self._rollback(version)
            self.results.rollbacks.append(
                {
                    "at_iteration": it,
                    "to_iteration": version,
                    "lost_stages": sorted(lost),
                    "t": self.results.now(),
                }
            )
            it = version
        for slot in self.slots:
            slot.tries = 0
        if self.on_recovered is not None:
            self.on_recovered(
                self, [c for c in self.results.crashes if c["node"] in {p["node"] for p in pending}]
            )
        return it

    # ------------------------------------------------------------------ iterations

    def _attempt(self, it: int) -> bool:
        """One epoch of iteration ``it``; True when committed, False when aborted (redo)."""
        self.epoch += 1
        epoch, members = self.epoch, self._members()
        self.inbox.clear()
        self.results.current_iteration = it
        self._broadcast("begin", epoch=epoch, iteration=it, members={str(k): v for k, v in members.items()})
        t_begin = time.monotonic()
        due = [
            s for s in self.slots if it in self.schedule.get(s.slot, []) and (s.slot, it) not in self.fired
        ]
        crash_at = t_begin + self.cfg.crash_point * self.results.last_wall_s() if due else None
        nodes = [n for ids in members.values() for n in ids]
        phase, deadline = "forward", t_begin + self.cfg.iteration_timeout
        while True:
            self._poll()
            now = time.monotonic()
            if crash_at is not None and (now >= crash_at or phase != "forward"):
                self._fire(due, it)
                crash_at = None
            if self._check_deaths() and phase != "commit":
                return self._abort(epoch, "a node died")
            got = {k: {n: m for n, m in v.items() if m.get("epoch") == epoch} for k, v in self.inbox.items()}
            alive = [n for n in nodes if not self.by_node[n].dead]
            if phase == "forward" and set(members[0]) <= set(got.get("iteration_end", {})):
                if crash_at is not None:
                    continue  # fire the scheduled crash before the gradient exchange
                self._broadcast("sync", epoch=epoch)
                phase = "sync"
            elif phase == "sync" and set(nodes) <= set(got.get("ready", {})):
                self._commit(epoch, it, members)
                phase = "commit"
            elif phase == "commit" and set(alive) <= set(got.get("committed", {})):
                self.results.iteration(it, epoch, got["iteration_end"], got["ready"], members)
                row = self.results.rows[-1]
                log.info(
                    "supervisor: iteration %d committed: %.3f s, loss %.4f", it, row["wall_s"], row["loss"]
                )
                return True
            if got.get("stalled"):
                return self._retry(epoch, it, f"stalled: {next(iter(got['stalled'].values()))['reason']}")
            if now > deadline:
                return self._retry(epoch, it, f"no commit within {self.cfg.iteration_timeout:.0f} s")

    def _fire(self, due: list[Slot], it: int) -> None:
        for slot in due:
            self.fired.add((slot.slot, it))
            if not self.strategy.kills:
                self.results.skipped.append({"slot": slot.slot, "stage": slot.stage, "iteration": it})
                log.info(
                    "supervisor: scheduled crash of slot %d at iteration %d skipped (no_failure)",
                    slot.slot,
                    it,
                )
                continue
            slot.crash = {
                "slot": slot.slot,
                "node": slot.occupant,
                "stage": slot.stage,
                "iteration": it,
                "cause": "scheduled SIGKILL",
                "t_crash": self.results.now(),
            }
            self._kill(slot, f"scheduled crash at iteration {it}")

    def _commit(self, epoch: int, it: int, members: dict[int, list[int]]) -> None:
        meta: dict[str, Any] = {"epoch": epoch, "iteration": it}
        if self.storage is not None and (it + 1) % self.cfg.checkpoint_interval == 0:
            meta["checkpoint_senders"] = [ids[0] for ids in members.values() if ids]
        self._broadcast("commit", **meta)

    def _abort(self, epoch: int, why: str) -> bool:
        log.warning("supervisor: epoch %d aborted (%s); the iteration is redone after recovery", epoch, why)
        self._broadcast("abort", epoch=epoch)
        self.results.aborts += 1
        return False

    def _retry(self, epoch: int, it: int, why: str) -> bool:
        self.results.failed_attempts[it] = self.results.failed_attempts.get(it, 0) + 1
        if self.results.failed_attempts[it] >= self.cfg.max_attempts:
            self._broadcast("abort", epoch=epoch)
            raise SwarmError(f"iteration {it} failed {self.cfg.max_attempts} attempts; last: {why}.")
        return self._abort(epoch, why)

    # ------------------------------------------------------------------ checkpoints, rollback, shutdown

    def _has_complete_checkpoint(self) -> bool:
        stages = range(self.cfg.n_stages + 1)
        return bool(self.stored) and bool(set.intersection(*(self.stored.get(s, set()) for s in stages)))

    def _complete_checkpoint(self) -> int:
        """Newest version that every stage has stored (0 if none)."""
        stages = range(self.cfg.n_stages + 1)
        versions = set.intersection(*(self.stored.get(s, set()) for s in stages)) if self.stored else set()
        return max(versions, default=0)

    def _checkpoint_initial(self) -> None:
        senders = [ids[0] for ids in self._members().values() if ids]
        self._broadcast("checkpoint", checkpoint_senders=senders)
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not all(0 in self.stored.get(s, set()) for s in range(self.cfg.n_stages + 1)):
            if time.monotonic() > deadline:
                raise SwarmError("the storage node did not store the initial checkpoint in time.")
            self._poll(0.02)

    def _rollback(self, version: int) -> None:
        targets = {s.occupant for s in self.slots if s.version != version}
        log.warning(
            "supervisor: a whole stage was lost; rolling %d nodes back to iteration %d", len(targets), version
        )
        self.inbox.pop("restored", None)
        for node in targets:
            self._send(node, MessageType.CONTROL, control("rollback", version=version))
        deadline = time.monotonic() + self.cfg.recovery_timeout
        while not targets <= set(self.inbox.get("restored", {})):
            self._poll(0.02)
            if self._check_deaths() or time.monotonic() > deadline:
                raise SwarmError(
                    f"rollback to iteration {version} did not finish (a node died or timed out)."
                )
        self.results.rollback_bytes += sum(m.get("bytes", 0) for m in self.inbox.get("restored", {}).values())

    def _shutdown(self) -> None:
        self.inbox.clear()
        self._broadcast("shutdown")
        expected = {s.occupant for s in self._all_slots() if not s.dead}
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        while not expected <= set(self.inbox.get("final", {})) and time.monotonic() < deadline:
            self._poll(0.02)
        missing = expected - set(self.inbox.get("final", {}))
        if missing:
            log.warning("supervisor: no final stats from nodes %s", sorted(missing))
        self.results.finals = self.inbox.get("final", {})
        for launcher in self.launchers:
            self._send(launcher, MessageType.CONTROL, control("shutdown"))
        self.host.wait_all(timeout=10.0)

    def write_config(self) -> None:
        (self.run_dir / "swarm_config.json").write_text(json.dumps(self.cfg.to_json(), indent=1))
