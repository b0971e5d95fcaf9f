"""The schema of the supervisor's journal (``journal.json``, checkfree.swarm.supervisor.journal): every field a
resumed supervisor reads, typed and bounded, unknown keys refused (the format is ours).

A journal is read by ``swarm run --resume`` only, and only its owner may have written it (mode 0600, checked by
:func:`checkfree.swarm.supervisor.journal.check_private`): still, a file edited by hand, damaged, or written by
another version must end in one sentence naming the file, the field, the value and what was expected (exit 2),
never in an AttributeError three calls later. The library is pydantic v2 in strict mode (checkfree.schemas says
why); the fields of its parts that have a loader of their own are checked there, after this schema: the swarm
config (``state.config``: checkfree.swarm.config, the bounds of its dataclass), a recovery plan
(``plan``: checkfree.recovery.planner ``RecoveryPlan.from_json``), the options (checked against ``swarm run``'s
parser by checkfree.swarm.cli) and the results (a generic encoding of checkfree.swarm.supervisor.results, read
back by ``decode_results``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictBool, StrictStr

from checkfree.schemas import fields as F

ID = F.count(0, 1 << 31, "a node id (an integer ≥ 0)")
"""A node or launcher id (launchers: 1,000,000 + their machine's START)."""
KEY = Annotated[StrictStr, Field(pattern=r"^-?\d{1,10}$", description="an integer written as a string")]
"""A JSON object key that stands for an integer (a node, a stage, an iteration)."""
COUNT = F.count(0, 1 << 62, "an integer ≥ 0")
ITERATION = F.count(0, F.MAX_ITERATIONS)
STAGE = F.count(-1, F.MAX_STAGES, "a stage (-1 for the storage node, else 0..S)")
ADDRESS = Annotated[StrictStr, Field(max_length=300, pattern=r"^tcp://", description="a tcp:// address")]
TEXT = Annotated[StrictStr, Field(max_length=F.MAX_NAME, description="a string")]
IDS = Annotated[list[ID], Field(max_length=F.MAX_ITEMS, description="a list of node ids")]
META = Annotated[dict[TEXT, JsonValue], Field(max_length=1000, description="an object of a node's report")]
PID = F.count(1, 1 << 22, "a process id (1 .. 4,194,304)")
START_TIME = F.count(0, 1 << 62, "a process start time (clock ticks since boot)")
STATUS = Literal["running", "completed", "failed", "interrupted"]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class SupervisorIdentity(_Strict):
    """The supervisor that wrote the journal: its pid and start time (a resume refuses while it runs)."""

    pid: PID
    started: START_TIME | None


class SlotRecord(_Strict):
    """One slot (checkfree.swarm.supervisor.state ``Slot.to_json``)."""

    slot: ID
    stage: STAGE
    location: TEXT
    local: StrictBool
    occupant: ID
    address: ADDRESS | None
    serving: StrictBool
    dead: StrictBool
    version: ITERATION
    tries: COUNT
    launcher: ID | None
    plan: dict[TEXT, JsonValue] | None
    plan_seq: COUNT
    replans: COUNT
    away: StrictBool
    back_at: ITERATION | None
    copy_version: ITERATION | None
    restarted: StrictBool
    consecutive: StrictBool
    rebuilt: Annotated[list[JsonValue], Field(max_length=8)] | None


class RosterRecord(_Strict):
    """The slots and who occupies them (``Roster.to_json``)."""

    slots: Annotated[list[SlotRecord], Field(min_length=1, max_length=F.MAX_SWARM_NODES)]
    storage: SlotRecord | None
    launchers: IDS
    launcher_addresses: Annotated[dict[KEY, ADDRESS], Field(max_length=F.MAX_SWARM_NODES)]
    next_id: ID
    revoked: IDS


class AttemptRecord(_Strict):
    """The attempt begun last (``Attempt.to_json``)."""

    number: COUNT
    iteration: ITERATION
    members: Annotated[dict[KEY, IDS], Field(max_length=F.MAX_STAGES + 1)]
    phase: Literal["forward", "sync", "commit", "over"]


class CheckpointsRecord(_Strict):
    """The versions the storage node holds (checkfree.swarm.supervisor.checkpoints)."""

    stored: Annotated[
        dict[KEY, Annotated[list[ITERATION], Field(max_length=F.MAX_ITEMS)]], Field(max_length=2000)
    ]
    lost_at: F.count(-1, F.MAX_ITERATIONS) | None


class StateRecord(_Strict):
    """The supervisor's control state (``SupervisorState.to_json``)."""

    setting: F.name("a setting's name")
    vocab_size: F.count(1, 1 << 24)
    config: dict[TEXT, JsonValue]
    roster: RosterRecord
    iteration: ITERATION
    attempt: COUNT
    begun_iteration: F.count(-1, F.MAX_ITERATIONS)
    schedule_clock: ITERATION
    fired: Annotated[
        list[Annotated[list[COUNT], Field(min_length=2, max_length=2)]], Field(max_length=F.MAX_ITEMS)
    ]
    failed_attempts: Annotated[dict[KEY, COUNT], Field(max_length=F.MAX_ITEMS)]
    commits: COUNT
    training: StrictBool
    checkpoints: CheckpointsRecord
    current: AttemptRecord | None


class IntentRecord(_Strict):
    """A commit decided and journaled before its broadcast (checkfree.swarm.supervisor.adoption ``CommitIntent``)."""

    attempt: COUNT
    iteration: ITERATION
    members: Annotated[dict[KEY, IDS], Field(max_length=F.MAX_STAGES + 1)]
    ends: Annotated[dict[KEY, META], Field(max_length=F.MAX_SWARM_NODES)]
    ready: Annotated[dict[KEY, META], Field(max_length=F.MAX_SWARM_NODES)]


class JournalRecord(_Strict):
    """``journal.json`` (format ``checkfree-swarm-journal-v1``; checkfree.swarm.supervisor.journal)."""

    format: Literal["checkfree-swarm-journal-v1"] = Field(description="'checkfree-swarm-journal-v1'")
    why: TEXT = Field(description="what made the supervisor write it (a string)")
    written: F.number(0.0, 1e12) = Field(description="when it was written (epoch seconds)")
    status: STATUS = Field(description="one of 'running', 'completed', 'failed', 'interrupted'")
    options: dict[TEXT, JsonValue] = Field(description="the options `swarm run` was started with (an object)")
    supervisor: SupervisorIdentity = Field(description="an object with the supervisor's pid and start time")
    address: ADDRESS = Field(description="the supervisor's tcp:// address")
    port: F.count(1, 65535) = Field(description="the supervisor's port (1 .. 65,535)")
    swarm_secret: Annotated[StrictStr, Field(min_length=40, max_length=40)] | None = Field(
        description="the swarm secret (40 Z85 characters) or null"
    )
    revoked_keys: IDS = Field(description="a list of node ids whose keys were revoked")
    state: StateRecord = Field(description="the supervisor's control state (an object)")
    intent: IntentRecord | None = Field(description="the commit intent (an object) or null")
    results: dict[TEXT, JsonValue] = Field(description="the results so far (an object)")
    processes: Annotated[
        dict[KEY, Annotated[list[F.count(1, 1 << 62)], Field(min_length=2, max_length=2)]],
        Field(max_length=F.MAX_NODES),
    ] = Field(description="an object mapping each node to [pid, start time]")
    recovery_kills: Annotated[list[StrictBool], Field(max_length=F.MAX_ITEMS)] = Field(
        description="a list of booleans (the recovery kills fired)"
    )
    resumes: COUNT = Field(description="how many times the run was resumed (an integer ≥ 0)")
