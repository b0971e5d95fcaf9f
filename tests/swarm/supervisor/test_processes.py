"""The supervisor's process bookkeeping over long runs: file descriptors of started nodes are released when
they are reaped (checkfree/swarm/hosts.py), and a slot's retry count (checkfree/swarm/supervisor/processes.py)."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.supervisor.phases.attempt import Attempting
from checkfree.swarm.supervisor.phases.recovering import Recovering
from checkfree.swarm.supervisor.state import Attempt
from checkfree.swarm.supervisor.supervisor import Supervisor, SwarmError

pytestmark = pytest.mark.timeout(300)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _wait_exited(host: LocalHost, node: int) -> int:
    deadline = time.monotonic() + 10
    while (code := host.exited(node)) is None:
        assert time.monotonic() < deadline, f"node {node} did not exit"
        time.sleep(0.002)
    return code


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_forked_nodes_release_their_pipes_when_reaped(tmp_path) -> None:
    """300 forked nodes, started and reaped as the supervisor does (half by its own SIGKILL, half found dead
    by ``exited``): the open descriptors stay flat (before the fix: +2 per node)."""
    host = LocalHost(tmp_path, "tcp://127.0.0.1:1", keys=None, mode="fork")
    try:
        for node in range(3):  # warm up: the forkserver and its socket
            host.spawn(node, 1, "Iowa", False)
            host.kill(node)
        before = _fds()
        for node in range(3, 303):
            pid = host.spawn(node, 1, "Iowa", node % 2 == 1)
            if node % 2:
                host.kill(node)
            else:
                os.kill(pid, signal.SIGKILL)  # a crash the supervisor notices by polling
                assert _wait_exited(host, node) == -signal.SIGKILL
        assert _fds() - before <= 8
    finally:
        host.reap_all()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_exec_nodes_do_not_keep_their_log_files_open(tmp_path) -> None:
    """``exec`` nodes: the log file is the child's; the supervisor keeps no descriptor per node."""
    true = shutil.which("true")
    assert true is not None
    host = LocalHost(tmp_path, "tcp://127.0.0.1:1", keys=None, mode="exec", python=true)
    try:
        host.spawn(0, 1, "Iowa", False)
        _wait_exited(host, 0)
        before = _fds()
        for node in range(1, 301):
            host.spawn(node, 1, "Iowa", True)
            assert _wait_exited(host, node) == 0
        assert _fds() - before <= 8
        assert (tmp_path / "node300.log").exists()
    finally:
        host.reap_all()


def test_storage_restarts_that_each_recover_do_not_add_up_to_giving_up(tmp_path) -> None:
    """Under ``checkpoint`` the storage node is killed and restarted 3 × max_attempts times; each restart
    serves, so its retry count starts afresh like a stage slot's (before the fix: 'slot 10 (stage -1)
    failed to start or recover 5 times; giving up' at the sixth restart). A slot that never serves still
    gives up after max_attempts starts."""
    cfg = SwarmConfig(model_config="tiny_config.json", replicas=1)
    sup = Supervisor(cfg, "checkpoint", {}, iterations=1, run_dir=tmp_path, vocab_size=300)
    serves = {"yes": True}

    def spawn(node: int, *args: object) -> int:
        sup.roster.by_node[node].serving = serves["yes"]  # the new process serves at once
        return 0

    sup.host.spawn = spawn  # type: ignore[method-assign]
    storage = sup.roster.storage
    assert storage is not None
    try:
        for slot in sup.roster.all():
            slot.serving = True
        for restart in range(3 * cfg.max_attempts):
            sup.state.current = Attempt(restart + 1, restart, {}, t_begin=0.0)
            sup.processes.mark_dead(storage, "process exited with code -9")
            sup.state.iteration = restart
            assert sup.drive(Recovering(restart), until=lambda p: isinstance(p, Attempting)) == restart
            assert storage.serving and storage.tries == 0
        serves["yes"] = False  # a storage node that never serves: the limit still holds
        for _ in range(cfg.max_attempts):
            sup.processes.spawn(storage, replacement=False)
        with pytest.raises(
            SwarmError, match=f"stage -1\\) failed to start or recover {cfg.max_attempts} times"
        ):
            sup.processes.spawn(storage, replacement=False)
    finally:
        sup.transport.close()
