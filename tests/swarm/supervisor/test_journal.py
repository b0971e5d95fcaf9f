"""The supervisor's journal (checkfree.swarm.supervisor.journal): written atomically with mode 0600, it holds the
control state, the results so far, the secret and the node processes, and a resumed supervisor gets back exactly
what was written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from checkfree.recovery.planner import RecoveryPlan
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.process_identity import AdoptedProcess, running, start_time
from checkfree.swarm.supervisor.journal import (
    JOURNAL_FILE,
    JournalError,
    keys_of,
    read_journal,
    write_atomic,
)
from checkfree.swarm.supervisor.state import Attempt, CommitIntent
from checkfree.swarm.supervisor.supervisor import Supervisor


def test_the_journal_is_replaced_atomically_and_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_FILE
    path.write_text("old")
    os.chmod(path, 0o644)
    write_atomic(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the swarm secret, like the join token
    assert sorted(p.name for p in tmp_path.iterdir()) == [JOURNAL_FILE]  # no temporary file left


def _supervisor(tmp_path: Path, **kw) -> Supervisor:
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    return Supervisor(
        cfg, "checkpoint", {1: [3]}, iterations=9, run_dir=tmp_path / "run", vocab_size=300, **kw
    )


def test_a_resumed_supervisor_gets_back_the_state_results_keys_and_intent_it_journaled(
    tmp_path: Path,
) -> None:
    sup = _supervisor(tmp_path, options={"iterations": 9, "setting": "checkpoint"})
    try:
        state, results = sup.state, sup.results
        slot = sup.roster.slots[2]
        slot.occupant, slot.plan, slot.tries, slot.address = 11, RecoveryPlan("replica", (2,)), 2, "tcp://h:1"
        slot.rebuilt = ("checkfree", (1, 3), (), "None")
        sup.roster.by_node[11] = slot
        sup.roster.next_id, sup.roster.revoked = 14, {12}
        sup.roster.launcher_addresses[1_000_004] = "tcp://b:7"
        sup.roster.launchers.add(1_000_004)
        state.iteration, state.attempt, state.schedule_clock, state.commits = 4, 9, 6, 4
        state.current = Attempt(9, 4, sup.roster.members(), t_begin=1.0)
        state.fired.add((1, 3))
        state.failed_attempts[4] = 1
        state.checkpoints.record(0, 4)
        results.start()
        results.iteration(3, 8, {0: {"loss": 5.0, "tokens": 64}}, {0: {"grad_norm": 1.5}}, {0: [0]})
        results.rows[-1]["loss"] = float("nan")  # a diverging run's NaN survives the journal (strict JSON)
        results.crashed(sup.roster.slots[1], "scheduled SIGKILL", 3)
        results.served(sup.roster.slots[1], {"stage": 1, "rule": "storage", "version": 3})
        results.crashed(sup.roster.slots[2], "process exited with code -9", 4)
        results.node_report(5, {"sent_bytes": {"FORWARD": 10}})
        sup.state.intent = CommitIntent(
            9, 4, {0: [0]}, {0: {"attempt": 9, "loss": 4.0}}, {0: {"grad_norm": 1.0}}
        )
        sup.journal.write("a test")
        written = state.to_json()
    finally:
        sup.transport.close()
    data = read_journal(tmp_path / "run")
    assert data["options"] == {"iterations": 9, "setting": "checkpoint"} and data["why"] == "a test"
    assert data["status"] == "running" and data["supervisor"]["pid"] == os.getpid()

    again = _supervisor(tmp_path, keys=keys_of(data))
    try:
        assert again.state.keys is not None and sup.state.keys is not None
        assert again.state.keys.public_key(5) == sup.state.keys.public_key(5)  # the same swarm secret
        assert again.state.keys.revoked == set()
        again.restore(data)
        back = again.state.to_json()
        assert back == written | {"current": back["current"]}
        assert back["current"] == {"number": 9, "iteration": 4, "members": written["current"]["members"],
                                   "phase": "over"}  # fmt: skip
        assert again.roster.by_node[11] is again.roster.slots[2] and again.roster.slots[2].rebuilt == (
            "checkfree",
            (1, 3),
            (),
            "None",
        )
        assert again.roster.launcher_addresses == {1_000_004: "tcp://b:7"} and again.roster.revoked == {12}
        assert again.state.intent == sup.state.intent and again.state.resumes == 1
        r = again.results
        assert [c.to_json() for c in r.crashes] == [c.to_json() for c in results.crashes]
        assert (
            r.open_crash(again.roster.slots[2]).cause == "process exited with code -9"
        )  # int keys come back
        assert r.reports == {5: {"sent_bytes": {"FORWARD": 10}}} and r.rows[0]["loss"] != r.rows[0]["loss"]
        assert (
            r.shortage.keys() == results.shortage.keys() and abs(r.now() - results.now()) < 5.0
        )  # one clock
    finally:
        again.transport.close()


def test_a_missing_damaged_or_foreign_journal_is_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="no such directory"):
        read_journal(tmp_path / "nope")
    with pytest.raises(JournalError, match="holds no journal.json"):
        read_journal(tmp_path)
    write_atomic(tmp_path / JOURNAL_FILE, "{not json")
    with pytest.raises(JournalError, match="cannot be read"):
        read_journal(tmp_path)
    write_atomic(tmp_path / JOURNAL_FILE, '{"format": "something-else"}')
    with pytest.raises(JournalError, match="is not a checkfree-swarm-journal-v1 journal"):
        read_journal(tmp_path)


def test_a_pid_names_a_process_only_with_its_start_time(tmp_path: Path) -> None:
    me = os.getpid()
    started = start_time(me)
    assert started is not None and running(me, started)
    assert not running(me, started + 1)  # the same pid, another process (a reused pid): never signalled
    other = AdoptedProcess(me, started + 1)
    assert other.poll() == -1  # gone as far as the journal's process goes
    other.kill()  # a no-op: it is not the journaled process (this test would die otherwise)


def test_the_journal_write_is_durable_the_file_synced_before_its_rename_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "rename", lambda *a: events.append("rename (not atomic over a file)"))
    write_atomic(tmp_path / JOURNAL_FILE, '{"a": 1}')
    assert events == ["fsync file", "rename", "fsync dir"]  # its data on disk, then its name, then the name's
    assert (tmp_path / JOURNAL_FILE).read_text() == '{"a": 1}'
