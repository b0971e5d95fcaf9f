"""The supervisor's control state, in one place: the slots and their occupants, the attempt in progress, the
schedule's clock, the retry counts and what the nodes reported (docs/paper.md §8).

A *slot* is a stage replica's place in the swarm (an initial node id, its stage and location); its *occupant* is
the node process serving it now (the initial node, then replacements with fresh ids). :class:`Roster` holds
every slot and answers who serves which stage. An *attempt* is one try at one training iteration (:class:`Attempt`:
``begin`` → forward → ``sync`` → ``commit``); an iteration takes several when one is aborted.

:class:`SupervisorState` is everything the supervisor's loop decides from; its parts read and change it, and
:class:`~checkfree.swarm.supervisor.results.Results` only records what happened. It is plain data: numbers, sets,
lists and the slots (whose plans serialise as :meth:`~checkfree.recovery.planner.RecoveryPlan.to_json`), so
:meth:`SupervisorState.to_json` can write it down, and a supervisor given the same state enters its loop where
this one was (checkfree.swarm.supervisor.supervisor ``Supervisor.run``, whose loop enters the state's phase).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.checkpoints import StoredCheckpoints
from checkfree.swarm.wire.auth import SwarmKeys


class PhaseInProgress(Protocol):
    """What the state holds of the phase the loop is in (checkfree.swarm.supervisor.phases.base ``Phase``, which
    imports this module: the state names only what it needs of it)."""

    name: str


class SwarmError(RuntimeError):
    """The swarm cannot make progress (a limit of retries was exceeded); the message says which."""


class Slot:
    """A stage replica's place in the swarm: an initial node id, its stage, location and current process.

    Its attributes are read anywhere and changed only by its own methods, one per event (:meth:`started`,
    :meth:`died`, :meth:`joined`, :meth:`serves`, :meth:`kept_away` ...; tests/swarm/supervisor/test_encapsulation.py
    checks that no code outside this class assigns them)."""

    def __init__(self, slot: int, stage: int, location: str, local: bool) -> None:
        self.slot, self.stage, self.location, self.local = slot, stage, location, local
        self.occupant = slot
        self.address: str | None = None
        self.serving = False
        self.dead = False
        self.version = 0
        self.tries = 0
        """Starts of this slot's node since it last served (at most ``max_attempts``)."""
        self.deadline = float("inf")
        """When a starting occupant that does not serve yet is killed (monotonic seconds)."""
        self.launcher: int | None = None
        """Id of the launcher that hosts this slot on another machine (None: local or not yet known)."""
        self.plan: RecoveryPlan | None = None
        """How this slot's replacement rebuilds its stage: planned once per loss event by the supervisor, and
        again when a recovering replacement's sources are all gone (sent to it as CONTROL ``plan``)."""
        self.plan_seq = 0
        """How many new plans the occupant was sent after its WELCOME's (its ``replan`` names the one it runs)."""
        self.replans = 0
        """How many of the occupant's ``replan`` requests were answered (at most one per plan, at most
        ``max_attempts`` in all: checkfree.swarm.supervisor.inbox)."""
        self.rebuilt: tuple[Any, ...] | None = None
        """(rule, source stages, parts, fallback) the occupant was rebuilt by, unless it is an initial node or
        a copy of a live replica: two replicas of one stage must not serve rebuilt by different plans."""
        self.away = False
        """Kept down by a down-interval schedule (no replacement) until the schedule clock reaches ``back_at``
        (checkfree.swarm.supervisor.outages)."""
        self.back_at: int | None = None
        """The schedule iteration an away slot comes back (None: not within the schedule)."""
        self.copy_version: int | None = None
        """The version of the CheckFree+ stage-0 copy the occupant last reported holding (stages 1 and S;
        None: it reported none, e.g. a holder rebuilt since stage 0 last pushed its copies)."""
        self.restarted = False
        """The occupant replaces one that died (set when the death is noticed, cleared when a node serves)."""
        self.consecutive = False
        """The slot's plan came from a loss event in which a directly adjacent stage was lost too (its recovery
        record's ``consecutive``, as the simulator's)."""

    # Every change of a slot is one of these events (tests/swarm/supervisor/test_encapsulation.py checks that
    # no code outside this class assigns a slot's attributes).

    def start_counted(self) -> int:
        """One more start of this slot's node since it last served; returns how many (the caller gives up past
        ``max_attempts``)."""
        self.tries += 1
        return self.tries

    def started(self, occupant: int, deadline: float) -> None:
        """``occupant`` (the same node again, or a replacement with a fresh id) is being started: it has not
        joined, serves nothing and was sent no plan; killed if it does not serve by ``deadline`` (monotonic s)."""
        self.occupant = occupant
        self.address, self.serving, self.dead = None, False, False
        self.plan_seq, self.rebuilt, self.copy_version = 0, None, None  # a new occupant: nothing sent, held
        self.replans = 0
        self.deadline = deadline

    def starts_forgiven(self) -> None:
        """The swarm recovered: the starts of this slot's node so far are no failing start."""
        self.tries = 0

    def awaited_until(self, deadline: float) -> None:
        """A resumed supervisor kills the occupant if it does not serve by ``deadline`` (monotonic seconds;
        ``inf``: it serves)."""
        self.deadline = deadline

    def died(self) -> None:
        """The occupant is gone: it serves no more, and the next one replaces it (``restarted``)."""
        self.dead, self.serving, self.restarted = True, False, True

    def start_retried(self) -> None:
        """An initial node failed to start: starting it again is a plain retry, not a replacement."""
        self.restarted = False

    def joined(self, address: str) -> None:
        """The occupant joined the swarm from ``address``."""
        self.address = address

    def serves(self, version: int, rebuilt: tuple[Any, ...] | None, storage: bool) -> bool:
        """The occupant serves, at ``version``, rebuilt by ``rebuilt`` (None: an initial node or a copy of a live
        replica); no deadline any more. A storage node's starts stop counting (however often it dies, it is no
        failing start). Returns whether it replaced one that died."""
        self.serving, self.version, self.rebuilt = True, version, rebuilt
        self.deadline = float("inf")
        restarted, self.restarted = self.restarted, False
        if storage:
            self.tries = 0
        return restarted

    def version_reported(self, version: int | None = None, copy_version: int | None = None) -> None:
        """The occupant reported holding its stage at ``version`` and/or the CheckFree+ stage-0 copy of
        ``copy_version`` (None: not reported, unchanged)."""
        if version is not None:
            self.version = version
        if copy_version is not None:
            self.copy_version = copy_version

    def kept_away(self, back_at: int | None) -> None:
        """A down-interval schedule keeps the slot down until schedule iteration ``back_at`` (None: to the end)."""
        self.away, self.back_at = True, back_at

    def came_back(self) -> None:
        """The schedule's down interval ended: the slot gets a replacement like a crashed one."""
        self.away, self.back_at = False, None

    def planned(self, plan: RecoveryPlan) -> bool:
        """``plan`` is how the slot's replacement rebuilds its stage; returns whether it changed."""
        changed, self.plan = plan != self.plan, plan
        return changed

    def plan_sent(self) -> int:
        """A new plan was sent to the occupant; returns its sequence number."""
        self.plan_seq += 1
        return self.plan_seq

    def replan_answered(self) -> None:
        """One of the occupant's ``replan`` requests was answered."""
        self.replans += 1

    def lost_in(self, consecutive: bool) -> None:
        """The slot's plan comes from a loss event in which a directly adjacent stage was lost too
        (``consecutive``) or not."""
        self.consecutive = consecutive

    def hosted_by(self, launcher: int) -> None:
        """Another machine's launcher (id ``launcher``) hosts the slot."""
        self.launcher = launcher

    def moved_here(self) -> None:
        """The slot's machine was revoked: its nodes start on the supervisor's machine from now on."""
        self.local, self.launcher = True, None

    def to_json(self) -> dict[str, Any]:
        """The slot as plain data (the deadline, a moment of this process's clock, is left out)."""
        return {
            "slot": self.slot,
            "stage": self.stage,
            "location": self.location,
            "local": self.local,
            "occupant": self.occupant,
            "address": self.address,
            "serving": self.serving,
            "dead": self.dead,
            "version": self.version,
            "tries": self.tries,
            "launcher": self.launcher,
            "plan": self.plan.to_json() if self.plan is not None else None,
            "plan_seq": self.plan_seq,
            "replans": self.replans,
            "away": self.away,
            "back_at": self.back_at,
            "copy_version": self.copy_version,
            "restarted": self.restarted,
            "consecutive": self.consecutive,
            "rebuilt": list(self.rebuilt) if self.rebuilt is not None else None,
        }

    def load(self, data: dict[str, Any], n_stages: int) -> None:
        """Take the fields :meth:`to_json` wrote (a resumed supervisor's journal,
        checkfree.swarm.supervisor.journal); a slot that does not serve gets a fresh start deadline.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not what :meth:`to_json` writes for this slot.
        """
        if (data["slot"], data["stage"]) != (self.slot, self.stage):
            raise ValueError(f"slot {data['slot']} of stage {data['stage']} is not slot {self.slot}")
        for key in ("location", "local", "occupant", "address", "serving", "dead", "version", "tries"):
            setattr(self, key, data[key])
        for key in ("launcher", "plan_seq", "replans", "away", "back_at", "copy_version", "restarted"):
            setattr(self, key, data[key])
        self.consecutive = data["consecutive"]
        self.plan = RecoveryPlan.from_json(data["plan"], n_stages) if data["plan"] is not None else None
        rebuilt = data.get("rebuilt")
        self.rebuilt = tuple(tuple(x) if isinstance(x, list) else x for x in rebuilt) if rebuilt else None


class Roster:
    """Every slot of the swarm (plus the storage node's, under ``checkpoint``) and who occupies it.

    Args:
        cfg: the topology. start, end: the initial node ids this machine starts (the rest join from
            launchers elsewhere). storage: whether the setting keeps a storage node.
    """

    def __init__(self, cfg: SwarmConfig, start: int, end: int, storage: bool) -> None:
        self.cfg = cfg
        table = cfg.location_table()
        self.slots = [
            Slot(n, cfg.stage_of(n), cfg.location_of(n, table), start <= n < end) for n in range(cfg.n_nodes)
        ]
        self.storage = Slot(cfg.storage_id, -1, cfg.storage_location, start == 0) if storage else None
        self.by_node: dict[int, Slot] = {}
        """Node id → its slot, for every node ever started (a dead occupant still maps to its slot)."""
        self.launchers: set[int] = set()
        """Ids of the other machines' launchers that joined."""
        self.launcher_addresses: dict[int, str] = {}
        """Launcher id → the address it joined from (a resumed supervisor dials it again)."""
        self.next_id = cfg.first_replacement_id
        """The id the next replacement gets."""
        self.revoked: set[int] = set()
        """Evicted node ids, whose keys every process withdrew (checkfree.swarm.supervisor.conduct)."""

    def all(self) -> list[Slot]:
        """The stage slots, then the storage node's slot (if any)."""
        return self.slots + ([self.storage] if self.storage is not None else [])

    def members(self) -> dict[int, list[int]]:
        """Stage → the occupants that serve it now."""
        out: dict[int, list[int]] = {s: [] for s in range(self.cfg.n_stages + 1)}
        for slot in self.slots:
            if slot.serving:
                out[slot.stage].append(slot.occupant)
        return out

    def lost_stages(self) -> set[int]:
        """Stages with no serving replica."""
        return {stage for stage, nodes in self.members().items() if not nodes}

    def holding_stages(self) -> set[int]:
        """Stages with a serving replica that reported holding its stage-0 copy (CheckFree+, docs/paper.md §3)."""
        return {s.stage for s in self.slots if s.serving and s.copy_version is not None}

    def peer_rows(self) -> list[list[Any]]:
        """``[node, stage, location, address]`` of every live occupant that joined (the ``peers`` table)."""
        return [
            [s.occupant, s.stage, s.location, s.address]
            for s in self.all()
            if s.address is not None and not s.dead
        ]

    def peers_fields(self) -> dict[str, Any]:
        """The fields of a ``peers`` command: the peer table, and the evicted ids whose keys nodes withdraw."""
        return {"peers": self.peer_rows()} | ({"revoked": sorted(self.revoked)} if self.revoked else {})

    def background_only(self) -> bool:
        """Whether every slot that does not serve (but those kept away) is a transformer-stage slot whose stage
        still has a serving replica: its replacement recovers in the background while the others train (issue 39
        point 3). A stage-0 slot is not: each stage-0 member drives one pipeline, so a ``begin`` without it would
        train on a smaller global batch; its replacement is waited for (the pausing recovery)."""
        if self.storage is not None and not (self.storage.serving or self.storage.away):
            return False
        lost = self.lost_stages()
        return all(s.serving or s.away or (s.stage != 0 and s.stage not in lost) for s in self.slots)

    def all_serving(self) -> bool:
        """Every slot serves, except those the schedule keeps away."""
        return all(s.serving or s.away for s in self.all())

    def to_json(self) -> dict[str, Any]:
        """The slots, the launchers (and the addresses they joined from), the next replacement id and the revoked
        ids, as plain data."""
        return {
            "slots": [s.to_json() for s in self.slots],
            "storage": self.storage.to_json() if self.storage is not None else None,
            "launchers": sorted(self.launchers),
            "launcher_addresses": {str(k): v for k, v in sorted(self.launcher_addresses.items())},
            "next_id": self.next_id,
            "revoked": sorted(self.revoked),
        }

    def load(self, data: dict[str, Any]) -> None:
        """Take what :meth:`to_json` wrote (a resumed supervisor's journal); ``by_node`` maps each slot's occupant.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not what :meth:`to_json` writes for this topology.
        """
        if len(data["slots"]) != len(self.slots) or (data["storage"] is None) != (self.storage is None):
            raise ValueError(
                f"the journal holds {len(data['slots'])} slots; this swarm has {len(self.slots)}"
            )
        for slot, row in zip(
            self.all(), data["slots"] + ([data["storage"]] if data["storage"] else []), strict=True
        ):
            slot.load(row, self.cfg.n_stages)
            self.by_node[slot.occupant] = slot
        self.launchers = set(data["launchers"])
        self.launcher_addresses = {int(k): v for k, v in data.get("launcher_addresses", {}).items()}
        self.next_id, self.revoked = data["next_id"], set(data["revoked"])


@dataclass
class CommitIntent:
    """A commit the supervisor decided and journaled before broadcasting it (module docstring).

    Attributes:
        attempt, iteration: the attempt and the iteration it commits. members: stage → the attempt's members.
        ends: stage-0 node → its ``ITERATION_END`` meta (loss, tokens). ready: node → its ``ready`` meta.
    """

    attempt: int
    iteration: int
    members: dict[int, list[int]]
    ends: dict[int, dict[str, Any]]
    ready: dict[int, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "iteration": self.iteration,
            "members": {str(k): v for k, v in sorted(self.members.items())},
            "ends": {str(k): v for k, v in sorted(self.ends.items())},
            "ready": {str(k): v for k, v in sorted(self.ready.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CommitIntent:
        """The intent :meth:`to_json` wrote.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not what :meth:`to_json` writes.
        """
        return cls(
            int(data["attempt"]),
            int(data["iteration"]),
            {int(k): list(v) for k, v in data["members"].items()},
            {int(k): dict(v) for k, v in data["ends"].items()},
            {int(k): dict(v) for k, v in data["ready"].items()},
        )


@dataclass
class Attempt:
    """The attempt in progress: one try at one iteration, as the supervisor runs it and checks reports against it.

    Attributes:
        number: the attempt's number (every attempt of the run gets the next one; nodes drop messages of older
            attempts). iteration: the iteration it tries. members: stage → the nodes that serve it in this
            attempt. t_begin: when ``begin`` was broadcast (the attempts' clock, seconds). phase: ``forward``,
            ``sync`` (broadcast), ``commit`` (broadcast) or ``over`` (committed or aborted: later reports of this
            attempt are stale). reported: command → the nodes whose report of it this attempt was taken (a
            second one is refused). due: the slots whose scheduled crash falls in it; crash_at: when they are
            killed (None: fired, or none due); deadline: when it is given up (``iteration_timeout``). begun: the
        members at ``begin`` (``members`` loses the nodes a ``reroute`` took out; the routes keep each pipeline on
        its nodes of ``begin`` that serve, checkfree.swarm.reroute). reroutes: the ``reroute`` commands sent in
        it. need_end: stage-0 node → the ``reroute`` after which its pipeline's ITERATION_END must be sent (one
        sent before is stale).
    """

    number: int
    iteration: int
    members: dict[int, list[int]]
    t_begin: float
    phase: str = "forward"
    reported: dict[str, set[int]] = field(default_factory=dict)
    due: list[int] = field(default_factory=list)
    crash_at: float | None = None
    deadline: float = float("inf")
    begun: dict[int, list[int]] = field(default_factory=dict)
    reroutes: int = 0
    need_end: dict[int, int] = field(default_factory=dict)

    def nodes(self) -> list[int]:
        """Every member of this attempt."""
        return [n for ids in self.members.values() for n in ids]

    def to_json(self) -> dict[str, Any]:
        """Number, iteration, members and phase, as plain data (its clock times are this process's)."""
        members = {str(k): v for k, v in sorted(self.members.items())}
        return {"number": self.number, "iteration": self.iteration, "members": members, "phase": self.phase}


Report = dict[int, dict[str, Any]]
"""Node → the meta of its report (a CONTROL command's fields, checked by checkfree.swarm.supervisor.inbox)."""


@dataclass
class Reports:
    """The nodes' reports the phases look for, one field per kind (node → its meta), filed only by the handlers of
    peer messages (checkfree.swarm.supervisor.inbox), read by the phases (checkfree.swarm.supervisor.phases), and taken
    out only by what acts on them (the planner answers the replans, the processes kill the failed recoveries, a phase
    clears what it awaits anew).

    Attributes:
        iteration_end, ready, committed, stalled: an attempt's reports (each meta names its ``attempt``).
        replan: recovering replacements' requests for a new plan (taken by the planner).
        recovery_failed: replacements whose recovery failed (killed by checkfree.swarm.supervisor.processes).
        restored: nodes rolled back to a checkpoint (``bytes`` restored). resumed: the answers to a resumed
        supervisor's ``resume`` (checkfree.swarm.supervisor.adoption). final: the nodes' final statistics.
    """

    iteration_end: Report = field(default_factory=dict)
    ready: Report = field(default_factory=dict)
    committed: Report = field(default_factory=dict)
    stalled: Report = field(default_factory=dict)
    replan: Report = field(default_factory=dict)
    recovery_failed: Report = field(default_factory=dict)
    restored: Report = field(default_factory=dict)
    resumed: Report = field(default_factory=dict)
    final: Report = field(default_factory=dict)

    def clear(self, *kinds: str) -> None:
        """Forget the reports of ``kinds`` (none named: every report; a new attempt begins, or the swarm shuts
        down)."""
        for name in kinds or [f.name for f in fields(self)]:
            setattr(self, name, {})

    def of_attempt(self, number: int) -> dict[str, Report]:
        """The attempt reports (``iteration_end``, ``ready``, ``committed``, ``stalled``) of attempt ``number``."""
        kinds = ("iteration_end", "ready", "committed", "stalled")
        return {k: {n: m for n, m in getattr(self, k).items() if m.get("attempt") == number} for k in kinds}


@dataclass
class SupervisorState:
    """What the supervisor's loop decides from (module docstring).

    Attributes:
        cfg, setting, vocab_size: the run (what WELCOME tells a node). keys: the swarm's keys (None: plain TCP).
        roster: the slots, their occupants and plans, retry counts per slot (``tries``, ``replans``).
        iteration: the iteration the next attempt runs (committed iterations + 1; a rollback moves it back).
        attempt: the number of the last attempt begun (0: none yet). current: that attempt (None before it).
        schedule_clock: schedule iterations elapsed (committed iterations + iterations waited for a returning
            node; checkfree.swarm.supervisor.outages). fired: (slot, schedule iteration) of the scheduled crashes
            that fired (a redone iteration does not refire them).
        failed_attempts: iteration → its attempts that stalled or timed out (at ``max_attempts`` the run stops).
        commits: attempts committed so far (an iteration redone after a rollback counts again).
        training: training has started (before, a node that fails to start is started again under its id, and
            nobody is evicted).
        reports: the nodes' reports the phases look for (:class:`Reports`).
        checkpoints: the versions the storage node holds (``checkpoint``).
        phase: the phase the supervisor's loop is in (checkfree.swarm.supervisor.phases; None before it starts).
        intent: the commit decided and journaled before its broadcast (None once the commit itself is journaled;
            checkfree.swarm.supervisor.adoption ``CommitIntent``). commit_unjournaled: a commit was recorded whose
            journal is written at the loop's next turn between attempts.
        status: ``running``, then how the run ended (``completed``, ``interrupted``, ``failed``; journaled).
        resumed_from: the journal this supervisor resumes (None for a new run). resumes: how many times the run
            was resumed. stale_after_resume: messages for the dead supervisor that a resumed one dropped.
    """

    cfg: SwarmConfig
    setting: str
    vocab_size: int
    keys: SwarmKeys | None
    roster: Roster
    iteration: int = 0
    attempt: int = 0
    current: Attempt | None = None
    schedule_clock: int = 0
    fired: set[tuple[int, int]] = field(default_factory=set)
    failed_attempts: dict[int, int] = field(default_factory=dict)
    commits: int = 0
    training: bool = False
    reports: Reports = field(default_factory=Reports)
    checkpoints: StoredCheckpoints = field(init=False)
    phase: PhaseInProgress | None = None
    intent: CommitIntent | None = None
    commit_unjournaled: bool = False
    status: str = "running"
    resumed_from: dict[str, Any] | None = None
    resumes: int = 0
    stale_after_resume: int = 0
    joined: set[int] = field(default_factory=set)
    """The crashed nodes whose replacement joined from the background and were handed to ``on_recovered``."""
    candidates: dict[int, int] = field(default_factory=dict)
    """Replacements recovering in the background (issue 39 point 3) that reported ``serving`` at a version the
    swarm had moved past, or during an attempt: node → that version (not journaled: a resumed supervisor asks
    every node). Each joins at an attempt boundary once it reports the swarm's version
    (checkfree.swarm.supervisor.inbox, checkfree.swarm.supervisor.phases.background)."""

    def __post_init__(self) -> None:
        self.checkpoints = StoredCheckpoints(self.cfg.n_stages)

    @property
    def begun_iteration(self) -> int:
        """The iteration of the last attempt begun (-1 before the first): no node's version may be ahead of
        it + 1, and a crash noticed now happened during it."""
        return self.current.iteration if self.current is not None else -1

    def to_json(self) -> dict[str, Any]:
        """The control state as plain data (the swarm's secret is not in it: it lives in the join token, mode
        0600); strict JSON."""
        return {
            "setting": self.setting,
            "vocab_size": self.vocab_size,
            "config": self.cfg.to_json(),
            "roster": self.roster.to_json(),
            "iteration": self.iteration,
            "attempt": self.attempt,
            "begun_iteration": self.begun_iteration,
            "schedule_clock": self.schedule_clock,
            "fired": sorted([slot, at] for slot, at in self.fired),
            "failed_attempts": {str(k): v for k, v in sorted(self.failed_attempts.items())},
            "commits": self.commits,
            "training": self.training,
            "checkpoints": {
                "stored": {str(s): sorted(v) for s, v in sorted(self.checkpoints.stored.items())},
                "lost_at": self.checkpoints.lost_at,
            },
            "current": self.current.to_json() if self.current is not None else None,
        }

    def load(self, data: dict[str, Any], now: float) -> None:
        """Take the control state :meth:`to_json` wrote (a resumed supervisor's journal,
        checkfree.swarm.supervisor.journal). The attempt that was begun comes back over (``phase`` ``over``, begun
        at ``now``): its reports went with the supervisor that ran it, and the resumed one redoes or finishes it
        (checkfree.swarm.supervisor.adoption). The reports start empty.

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not what :meth:`to_json` writes for this swarm.
        """
        self.roster.load(data["roster"])
        self.iteration, self.attempt = data["iteration"], data["attempt"]
        self.schedule_clock, self.commits = data["schedule_clock"], data["commits"]
        self.training = data["training"]
        self.fired = {(slot, at) for slot, at in data["fired"]}
        self.failed_attempts = {int(k): v for k, v in data["failed_attempts"].items()}
        self.checkpoints.stored = {int(k): set(v) for k, v in data["checkpoints"]["stored"].items()}
        self.checkpoints.lost_at = data["checkpoints"]["lost_at"]
        current = data.get("current")
        self.current = None
        if current is not None:
            members = {int(k): list(v) for k, v in current["members"].items()}
            self.current = Attempt(current["number"], current["iteration"], members, now, phase="over")
        self.reports.clear()
