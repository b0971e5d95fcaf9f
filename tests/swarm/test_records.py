"""Records that say what happened (issue 37, point 7): throughput.json's ``attempts`` counts the tries an
iteration took, and refused connections are logged when they happen (rate-limited), never deferred to the next
refusal or the transport's close."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.results import Results
from checkfree.swarm.supervisor.state import Reports
from checkfree.swarm.supervisor.supervisor import Supervisor
from checkfree.swarm.wire.auth import REFUSAL_KEYS_NAMED, KeyRing, RefusalLog, SwarmKeys

# ---------------------------------------------------------------------- attempts per iteration


def test_a_rows_loss_adds_the_pipelines_losses_in_pipeline_order_not_arrival_order() -> None:
    """Two runs whose ITERATION_ENDs come in other orders record the same bits (issue 39)."""
    losses = {10: 1e16, 11: 1.0, 12: -1e16}  # stage-0 node → its loss; float addition is not associative
    members, rows = {0: [10, 11, 12]}, []
    for arrival in ([12, 10, 11], [10, 11, 12]):
        results = Results(SwarmConfig(model_config="tiny_config.json", replicas=3), "ours", 10)
        results.start()
        ends = {n: {"loss": losses[n], "tokens": 8} for n in arrival}
        results.iteration(0, 0, ends, {10: {"grad_norm": 1.0}}, members)
        rows.append(results.rows[0]["loss"])
    in_pipeline_order = (losses[10] + losses[11] + losses[12]) / 3
    assert rows == [in_pipeline_order, in_pipeline_order]
    assert (losses[12] + losses[10] + losses[11]) / 3 != in_pipeline_order  # the first arrival order's sum


def test_a_rows_attempts_counts_the_aborted_tries_of_its_iteration() -> None:
    results = Results(SwarmConfig(model_config="tiny_config.json", replicas=1), "ours", 10)
    results.start()
    ends, ready, members = {0: {"loss": 2.0, "tokens": 8}}, {0: {"grad_norm": 1.0}}, {0: [0]}
    results.aborted(4)
    results.aborted(4)
    results.iteration(4, 7, ends, ready, members)
    results.iteration(5, 8, ends, ready, members)
    results.aborted(6)
    results.iteration(6, 10, ends, ready, members)
    assert [(r["iteration"], r["attempt"], r["attempts"]) for r in results.rows] == [
        (4, 7, 3),
        (5, 8, 1),
        (6, 10, 2),
    ]
    assert results.aborts == 3 and results.redone == {}


class _Swarm:
    """What an attempt talks to, on a fake clock: stage-0 nodes end their pipelines 0.1 s after ``begin``, every
    node is ready right after ``sync`` and committed right after ``commit``; ``die_once`` kills slot 1 at the
    first ``begin``'s first receive."""

    def __init__(self, reports: Reports, roster) -> None:
        self.reports, self.roster, self.t = reports, roster, 0.0
        self.attempt, self.members, self.begun = 0, {}, 0.0
        self.die_once = True
        self.died = False

    def broadcast(self, command: str, **meta: object) -> None:
        nodes = [n for ids in self.members.values() for n in ids]
        if command == "begin":
            self.attempt, self.begun = int(meta["attempt"]), self.t  # type: ignore[call-overload]
            self.members = {int(k): v for k, v in meta["members"].items()}  # type: ignore[union-attr]
        if command == "sync":
            self.reports.ready = {n: {"attempt": self.attempt, "grad_norm": 1.0} for n in nodes}
        if command == "commit":
            self.reports.committed = {n: {"attempt": self.attempt} for n in nodes}

    def command(self, node: int, command: str, **meta: object) -> None:
        pass

    def recv(self, timeout: float = 0.0) -> None:
        self.t += 0.01
        if self.die_once:  # a member dies (a non-member's death aborts nothing: issue 39 point 3)
            self.die_once, self.died = False, True
            self.roster.slots[1].died()
        if self.t - self.begun >= 0.1:
            ends = {n: {"attempt": self.attempt, "loss": 1.0, "tokens": 1} for n in self.members[0]}
            self.reports.iteration_end = ends

    def check_deaths(self) -> bool:
        died, self.died = self.died, False
        return died


def test_an_iteration_redone_after_a_death_records_two_attempts(tmp_path: Path) -> None:
    """The supervisor's own path: a death aborts the first attempt at iteration 3, the second commits it; its
    row says 2 tries (before the fix: 1, as only stalls and timeouts were counted)."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "ours", {}, iterations=4, run_dir=tmp_path, vocab_size=300)
    try:
        for slot in sup.roster.slots:
            slot.serving = True
            sup.roster.by_node[slot.occupant] = slot
        fake = _Swarm(sup.state.reports, sup.roster)
        sup.link = sup.attempts.link = sup.processes = fake  # type: ignore[assignment]
        sup.attempts.clock = lambda: fake.t
        sup.results.start()
        assert sup.drive(Attempting(3), until=lambda p: True) is False  # the death aborts it
        assert sup.drive(Attempting(3), until=lambda p: True) is True
        assert [(r["iteration"], r["attempts"]) for r in sup.results.rows] == [(3, 2)]
        assert sup.results.aborts == 1
    finally:
        sup.transport.close()


# ---------------------------------------------------------------------- refused connections


class _Timers:
    """A fake ``schedule``: the calls due, run by :meth:`advance` when the fake clock reaches them."""

    def __init__(self, now: list[float]) -> None:
        self.now, self.due = now, []

    def __call__(self, delay_s: float, fn: Callable[[], None]) -> None:
        self.due.append((self.now[0] + delay_s, fn))

    def advance(self, to: float) -> None:
        self.now[0] = to
        for t, fn in sorted(self.due, key=lambda d: d[0]):
            if t <= to:
                self.due.remove((t, fn))
                fn()


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "checkfree.swarm.wire.auth"]


def test_a_refusal_is_logged_at_once_or_in_the_summary_at_most_every_seconds_later(caplog) -> None:
    """A key's first refusal is logged at once; its retries within the next 10 s are summed in one line logged
    when the 10 s are up, with no further refusal to flush it (before the fix: at the next refusal or at the
    transport's close, 151 s late once)."""
    now = [100.0]
    timers = _Timers(now)
    log = RefusalLog(every=10.0, clock=lambda: now[0], schedule=timers)
    ring = KeyRing({3: SwarmKeys.new().public_key(3)})
    ring.refusals = log
    caplog.set_level(logging.WARNING, logger="checkfree.swarm.wire.auth")
    stranger = SwarmKeys.new().public_key(0).encode()
    assert not ring.callback("checkfree-swarm", stranger)
    assert len(_lines(caplog)) == 1 and "from an unknown CURVE key" in _lines(caplog)[0]  # at once
    for t in (101.0, 102.0, 105.0):
        now[0] = t
        ring.callback("checkfree-swarm", stranger)
    assert len(_lines(caplog)) == 1  # within the window: no line per refusal
    timers.advance(110.5)
    assert len(_lines(caplog)) == 1  # the window opened at 101: its line is due at 111
    timers.advance(111.0)
    summary = _lines(caplog)[1:]
    assert len(summary) == 1 and re.search(r"refused 3 more connection\(s\) from 1 unknown", summary[0])
    assert "in the last 10 s" in summary[0]
    timers.advance(500.0)
    log.flush()
    assert len(_lines(caplog)) == 2 and log.refused == 4  # nothing more to say
    now[0] = 501.0
    ring.callback("checkfree-swarm", stranger)  # a new window, due at 511
    assert [t for t, _ in timers.due] == [511.0]
    timers.advance(511.0)
    assert len(_lines(caplog)) == 3 and "refused 1 more" in _lines(caplog)[2]


def test_many_keys_refused_are_named_up_to_a_bound_then_summed(caplog) -> None:
    now = [0.0]
    timers = _Timers(now)
    log = RefusalLog(every=10.0, clock=lambda: now[0], schedule=timers)
    caplog.set_level(logging.WARNING, logger="checkfree.swarm.wire.auth")
    keys = [f"key{i:04d}".encode() for i in range(REFUSAL_KEYS_NAMED + 5)]
    for key in keys:
        log.refuse(key)
    assert len(_lines(caplog)) == REFUSAL_KEYS_NAMED
    timers.advance(10.0)
    assert len(_lines(caplog)) == REFUSAL_KEYS_NAMED + 1 and "refused 5 more" in _lines(caplog)[-1]
