"""What a phase of the supervisor's loop is, what it is given and what it returns (checkfree.swarm.supervisor.phases).

A phase decides; it never waits, never sends, never kills and never journals. The supervisor's loop
(checkfree.swarm.supervisor.supervisor ``Supervisor.drive``) turns as follows: it receives every message that
arrives within the phase's ``poll_s`` (each offered first to :meth:`Phase.take`, then routed to the handlers of
peer messages, checkfree.swarm.supervisor.inbox, which file the nodes' reports in the state's ``reports``), notices
deaths (with ``watch_deaths``), then asks the phase: :meth:`Phase.enter` on its first turn (nothing received yet),
:meth:`Phase.step` on every later one, and :meth:`Phase.expired` when the step decided nothing and the phase's
``deadline`` has passed: every deadline of the supervisor is this one mechanism. The phase answers a
:class:`Decision`: the actions to carry out, in order (the loop's executor calls the named part's operation:
:class:`Act`), and the phase to be in next (itself to stay; :data:`DONE` to end the drive with a result).

A phase reads and updates the supervisor's state (checkfree.swarm.supervisor.state; its own fields and the attempt
in progress), reads the results recorded so far, and asks the deciding parts that only read the state or change it
(:class:`Context`: the attempts' ``advance``, the outages' schedule, the validations' and the model's
bookkeeping); everything that reaches a process or a file is an :class:`Act`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from checkfree.swarm.supervisor.state import SupervisorState

if TYPE_CHECKING:
    from checkfree.swarm.policies import SwarmPolicy
    from checkfree.swarm.supervisor.attempts import Attempts
    from checkfree.swarm.supervisor.model_io import ModelIO
    from checkfree.swarm.supervisor.outages import Outages
    from checkfree.swarm.supervisor.recovery_kills import RecoveryKills
    from checkfree.swarm.supervisor.results import Results
    from checkfree.swarm.supervisor.validation import ValidationRuns
    from checkfree.swarm.wire.protocol import Message

RECOVERY_POLL_S = 0.02
"""Wait of one receive while the swarm starts, recovers, rolls back, waits or shuts down, seconds."""
POLL_S = 0.005
"""Wait of one receive in an attempt or a validation, seconds."""


@dataclass(frozen=True)
class Act:
    """One action: call ``op(*args, **kwargs)`` of the supervisor's part ``part`` (``link``: messages to nodes,
    ``processes``: starting and killing nodes, ``journal``, ``results``, ``attempts``, ``planner``,
    ``validation``, ``model_io``, ``host``, ``failpoints``, or ``supervisor``: the executor's own steps that
    combine several, such as a scheduled crash or the record of a commit)."""

    part: str
    op: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def act(part: str, op: str, *args: Any, **kwargs: Any) -> Act:
    """An :class:`Act` of ``part.op(*args, **kwargs)``."""
    return Act(part, op, args, kwargs)


def broadcast(command: str, **meta: Any) -> Act:
    """CONTROL ``command`` to every live occupant that joined."""
    return act("link", "broadcast", command, **meta)


def command(node: int, name: str, **meta: Any) -> Act:
    """CONTROL ``name`` to node (or launcher) ``node``."""
    return act("link", "command", node, name, **meta)


def journal(why: str) -> Act:
    """Write the journal now (checkfree.swarm.supervisor.journal)."""
    return act("journal", "write", why)


def die_if(point: str, iteration: int, after_s: float = 0.0) -> Act:
    """The resume tests' fault injection (checkfree.swarm.supervisor.failpoints; unset in real runs)."""
    return act("failpoints", "die_if", point, iteration, after_s=after_s)


def kill(slot: Any, why: str) -> Act:
    """SIGKILL ``slot``'s occupant and mark it dead."""
    return act("processes", "kill", slot, why)


def record(event: str, *args: Any, **kwargs: Any) -> Act:
    """Record ``event`` in the results (throughput.json)."""
    return act("results", event, *args, **kwargs)


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Any = _Done()
"""The next phase of a phase that ends the drive (:attr:`Decision.result` is what the drive returns)."""


@dataclass
class Decision:
    """A phase's answer for one turn: ``actions`` to carry out in order, then be in ``next`` (the same phase to
    stay, :data:`DONE` to end the drive, returning ``result``)."""

    actions: list[Act]
    next: Any
    result: Any = None


@dataclass(frozen=True)
class Turn:
    """What the loop saw in one turn: ``now`` (the loop's clock, monotonic seconds) and whether a stage node died
    since the last turn (``died``; only for a phase that ``watch_deaths``)."""

    now: float
    died: bool = False


@dataclass
class Context:
    """What a phase reads and asks, besides the state (module docstring).

    Attributes:
        state: the supervisor's state. results: what was recorded so far (read only). iterations: the target.
        policy: the setting's recovery policy. attempts, outages, validation, model_io, recovery_kills: the
        deciding parts (a phase calls only their methods that change nothing but the state). host: this
        machine's processes (read only: ``procs``, ``exited(node)``, the exit code of a process that exited).
        silent: the nodes silent for ``peer_timeout``. run_dir: the run's directory (named in messages).
        phases: every phase by name (checkfree.swarm.supervisor.phases.table ``PHASES``): a phase builds the next
        one through it, never by importing its module (the transitions form a cycle, the imports must not).
    """

    state: SupervisorState
    results: Results
    iterations: int
    policy: SwarmPolicy
    attempts: Attempts
    outages: Outages
    validation: ValidationRuns
    model_io: ModelIO
    recovery_kills: RecoveryKills
    host: Any
    silent: Callable[[], set[int]]
    run_dir: Any = None
    phases: Any = None


class Phase:
    """One phase of the supervisor's loop (module docstring). Subclasses set ``name`` and override
    :meth:`enter` and, if they wait, :meth:`step` (and :meth:`expired` if they have a deadline).

    Attributes:
        poll_s: the longest wait of one receive in this phase (None: the phase decides at once, nothing is
            received). police: after receiving, evict the nodes whose messages were rejected too often and shut
            out the machines revoked (once training started). watch_deaths: the loop checks for dead nodes before
            each step. deadline: when the phase's wait is over (the loop's clock; inf: none; :meth:`ends_at`).
    """

    name = "phase"
    poll_s: float | None = RECOVERY_POLL_S
    police = True
    watch_deaths = False
    deadline = math.inf

    def poll(self, now: float) -> float | None:
        """The longest wait of the next receive (``poll_s``; None: nothing is received)."""
        return self.poll_s

    def ends_at(self, ctx: Context) -> float:
        """When the phase's wait is over (``deadline``, the loop's clock)."""
        return self.deadline

    def holds_signals(self, ctx: Context) -> bool:
        """A stop signal waits until the turn's messages are taken (checkfree.swarm.hosts ``held_signals``)."""
        return False

    def enter(self, ctx: Context, now: float) -> Decision:
        """The first turn in this phase (nothing received yet)."""
        return self.stay()

    def step(self, ctx: Context, turn: Turn) -> Decision:
        """A later turn, after the loop received what came."""
        return self.stay()

    def expired(self, ctx: Context, turn: Turn) -> Decision:
        """The step decided nothing and ``deadline`` has passed."""
        raise NotImplementedError(f"the {self.name} phase has a deadline but no expiry")

    def take(self, msg: Message, ctx: Context) -> bool:
        """Offered each received message first: True when the phase took it (it is not routed further)."""
        return False

    def interrupted(self, ctx: Context) -> Phase | None:
        """A stop signal (KeyboardInterrupt) in this phase: the phase to drive before the run stops (None: none)."""
        return None

    def abandon(self, ctx: Context) -> None:
        """The drive stops in this phase (an exception): leave the state consistent."""

    def stay(self, actions: list[Act] | None = None) -> Decision:
        """Stay in this phase after ``actions``."""
        return Decision(actions or [], self)

    def __repr__(self) -> str:
        return f"<{self.name}>"


def done(actions: list[Act] | None = None, result: Any = None) -> Decision:
    """End the drive after ``actions``, returning ``result``."""
    return Decision(actions or [], DONE, result)


def then(actions: list[Act], phase: Phase | None, result: Any = None) -> Decision:
    """Go on to ``phase`` after ``actions``; None ends the drive with ``result`` (a phase driven alone, by a test)."""
    return Decision(actions, phase if phase is not None else DONE, result)
