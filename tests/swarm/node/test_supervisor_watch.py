"""A node whose supervisor fell silent (checkfree.swarm.node.supervisor_watch, .iteration): it keeps its state,
waits ``supervisor_grace`` seconds for a resumed supervisor, then exits; the attempt in flight is dropped, but
gradients that await a ``commit`` are kept, and a commit steps once, however often it is sent."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from checkfree.swarm.node.context import AttemptClock, NodeContext, StageState
from checkfree.swarm.node.iteration import IterationCommands
from checkfree.swarm.node.membership import Membership
from checkfree.swarm.node.supervisor_watch import SupervisorWatch
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import ProtocolError

from helpers.swarm import Sent


def test_a_silent_supervisor_is_waited_for_for_its_grace_then_the_process_exits() -> None:
    now = [100.0]
    watch = SupervisorWatch("node 3", grace=60.0, clock=lambda: now[0])
    assert watch.check(silent=False) == "" and not watch.away
    assert watch.check(silent=True) == "lost" and watch.away  # once: the caller drops what is in flight
    now[0] += 59.0
    assert (
        watch.check(silent=True) == "" and watch.check(silent=False) == ""
    )  # heartbeats alone do not end it
    watch.back()  # a resumed supervisor's `resume`
    now[0] += 30.0
    assert watch.check(silent=False) == "" and not watch.away
    assert watch.check(silent=True) == "lost"
    now[0] += 60.5
    assert watch.check(silent=True) == "expired"


class _Parts(SimpleNamespace):
    pass


def _commands(reduced: int) -> tuple[IterationCommands, StageState, list[str]]:
    module = torch.nn.Linear(2, 2)
    state = StageState(module, W.make_optimizer(module, 1e-2), version=7)
    for p in module.parameters():
        p.grad = torch.ones_like(p)  # the averaged gradients of attempt 4
    calls: list[str] = []
    gradients = SimpleNamespace(reduced=reduced, norm=2.0, reset=lambda: calls.append("gradients.reset"))
    worker = SimpleNamespace(
        reset=lambda: (calls.append("worker.reset"), module.zero_grad(set_to_none=True)),
        microbatch_seconds=lambda: None,  # the attempt's compute per microbatch (none here)
    )
    parts = _Parts(
        state=state,
        gradients=gradients,
        worker=worker,
        pipeline=object(),
        stage0_copies=SimpleNamespace(push=lambda: None),
    )
    ctx = NodeContext(3, 1, AttemptClock(attempt=4, iteration=7), Membership(3), Sent())
    report = {"sent_bytes": {}, "sent_messages": {}, "dropped_malformed": 0, "bad_messages": 0}
    report |= {"compute": {}, "version": 0}
    commands = IterationCommands(
        ctx, parts, lambda msg: None, lambda: True, lambda: None, lambda: dict(report)
    )
    return commands, state, calls


def test_hold_drops_the_attempt_in_flight_but_keeps_gradients_that_await_a_commit() -> None:
    commands, state, calls = _commands(reduced=-1)  # mid-forward: nothing reduced yet
    assert commands.hold() is None and calls == ["worker.reset", "gradients.reset"]
    assert all(p.grad is None for p in state.module.parameters())
    commands, state, calls = _commands(reduced=4)  # ready, waiting for `commit`
    assert commands.hold() == 4 and calls == []
    assert all(p.grad is not None for p in state.module.parameters())


def test_a_commit_finished_by_a_resumed_supervisor_steps_once() -> None:
    commands, state, _ = _commands(reduced=4)
    commands.hold()
    before = [p.detach().clone() for p in state.module.parameters()]
    commands.commit({"attempt": 4, "iteration": 7})
    assert state.version == 8 and any(
        not torch.equal(a, b) for a, b in zip(before, state.module.parameters(), strict=True)
    )
    with pytest.raises(ProtocolError, match="has reduced the gradients of attempt -1"):
        commands.commit({"attempt": 4, "iteration": 7})  # sent again: refused, never a second step
    assert state.version == 8
