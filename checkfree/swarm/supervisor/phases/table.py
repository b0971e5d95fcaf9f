"""Every phase of the supervisor's loop by name (checkfree.swarm.supervisor.phases): a phase names the one that
follows it through ``ctx.phases`` (checkfree.swarm.supervisor.phases.base ``Context``), never by importing its
module, so the phases, whose transitions form a cycle (between → attempt → after a commit → between …), import
only ``base`` and no module imports another in a circle. The supervisor and the tests give this table to the
context."""

from __future__ import annotations

from types import SimpleNamespace

from checkfree.swarm.supervisor.phases.adopting import Adopting
from checkfree.swarm.supervisor.phases.after_commit import AfterCommit
from checkfree.swarm.supervisor.phases.attempt import Attempting, crash_actions
from checkfree.swarm.supervisor.phases.background import Background, Joining, joined
from checkfree.swarm.supervisor.phases.between import Between, after_returns, end_of_training, proceed
from checkfree.swarm.supervisor.phases.commit_in_flight import CommitInFlight
from checkfree.swarm.supervisor.phases.finishing_commit import FinishingCommit
from checkfree.swarm.supervisor.phases.gathering import GatheringModel
from checkfree.swarm.supervisor.phases.recovering import Recovered, Recovering
from checkfree.swarm.supervisor.phases.resumed import Resumed
from checkfree.swarm.supervisor.phases.resuming import Resuming
from checkfree.swarm.supervisor.phases.rolling_back import RollingBack
from checkfree.swarm.supervisor.phases.shutting_down import ShuttingDown
from checkfree.swarm.supervisor.phases.starting import Starting
from checkfree.swarm.supervisor.phases.storing_initial import StoringInitial
from checkfree.swarm.supervisor.phases.training import ScheduleOver, TrainingBegins
from checkfree.swarm.supervisor.phases.validating import Validating
from checkfree.swarm.supervisor.phases.waiting import WaitingForReturns

PHASES = SimpleNamespace(
    Adopting=Adopting,
    AfterCommit=AfterCommit,
    Attempting=Attempting,
    Background=Background,
    Between=Between,
    CommitInFlight=CommitInFlight,
    FinishingCommit=FinishingCommit,
    GatheringModel=GatheringModel,
    Joining=Joining,
    Recovered=Recovered,
    Recovering=Recovering,
    Resumed=Resumed,
    Resuming=Resuming,
    RollingBack=RollingBack,
    ScheduleOver=ScheduleOver,
    ShuttingDown=ShuttingDown,
    Starting=Starting,
    StoringInitial=StoringInitial,
    TrainingBegins=TrainingBegins,
    Validating=Validating,
    WaitingForReturns=WaitingForReturns,
    after_returns=after_returns,
    crash_actions=crash_actions,
    end_of_training=end_of_training,
    joined=joined,
    proceed=proceed,
)
"""Phase classes and the helpers that pick a next phase (``proceed``, ``after_returns``, ``end_of_training``) or
build a crash's actions (``crash_actions``), by their names."""
