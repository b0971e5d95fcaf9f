"""The supervisor's loop itself (Supervisor.drive), with a stub phase and no node: a phase's deadline is asked only
once a step decided nothing, ``until`` stops at the next phase, a stop signal drives the phase the interrupted one
names and leaves the state consistent, and the state's phase is the one in progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.phases.base import Decision, Phase, done
from checkfree.swarm.supervisor.supervisor import Supervisor


class _Link:
    """Receives nothing; each receive takes 1 s of the fake clock."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def recv(self, timeout: float) -> None:
        self.clock[0] += 1.0


class _Stub(Phase):
    name = "stub"

    def __init__(self, deadline_in: float, decide_at: float | None = None) -> None:
        self.deadline_in, self.decide_at = deadline_in, decide_at
        self.steps, self.phases_seen, self.abandoned = 0, [], False

    def enter(self, ctx, now: float) -> Decision:
        self.deadline = now + self.deadline_in
        return self.stay()

    def step(self, ctx, turn) -> Decision:
        self.steps += 1
        self.phases_seen.append(ctx.state.phase)
        assert self.steps < 100, "the deadline was never asked"
        if self.decide_at is not None and turn.now >= self.decide_at:
            return done(result="decided")
        return self.stay()

    def expired(self, ctx, turn) -> Decision:
        return done(result=f"expired at {turn.now:.0f}")

    def abandon(self, ctx) -> None:
        self.abandoned = True


@pytest.fixture
def sup(tmp_path: Path):
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "ours", {}, iterations=4, run_dir=tmp_path, vocab_size=300)
    clock = [0.0]
    sup.link = _Link(clock)  # type: ignore[assignment]
    sup.attempts.clock = lambda: clock[0]
    yield sup
    sup.transport.close()


def test_a_deadline_is_one_mechanism_asked_only_when_the_step_decided_nothing(sup: Supervisor) -> None:
    stub = _Stub(deadline_in=5.0)
    assert sup.drive(stub) == "expired at 6" and stub.steps == 6
    assert stub.phases_seen == [stub] * 6 and sup.state.phase is None
    stub = _Stub(deadline_in=5.0, decide_at=6.0)  # a decision in the turn the deadline passed wins
    assert sup.drive(stub) == "decided"


def test_until_stops_at_the_next_phase_and_a_stop_signal_drives_the_phase_named(sup: Supervisor) -> None:
    class Hop(_Stub):
        def step(self, ctx, turn) -> Decision:
            return Decision([], _Stub(1.0), "hopped")

    assert sup.drive(Hop(1.0), until=lambda p: isinstance(p, _Stub)) == "hopped"
    follow = _Stub(deadline_in=2.0)

    class Interrupted(_Stub):
        def step(self, ctx, turn) -> Decision:
            raise KeyboardInterrupt

        def interrupted(self, ctx) -> Phase:
            return follow

    phase = Interrupted(1.0)
    with pytest.raises(KeyboardInterrupt):
        sup.drive(phase)
    assert follow.steps == 3 and phase.abandoned and sup.state.phase is None
