"""A stop signal at any moment leaves no process behind (checkfree/swarm/hosts.py, ``held_signals``).

``swarm run`` turns SIGTERM into a KeyboardInterrupt (checkfree.cli). Raised between a node's fork and the record
of its pid, it used to orphan that node, and with it the forkserver and its resource tracker, which wait for every
forked node. The first test sends the signal exactly there; the second stops a real ``swarm run`` while it starts
its nodes and looks for anything of its session left alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkfree.cli import _terminate
from checkfree.swarm.hosts import LocalHost
from checkfree.swarm.process_identity import running, start_time

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]


def _gone(pid: int, started: int, timeout: float = 30.0) -> bool:
    """Whether process ``pid`` (started at ``started``) is gone within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while running(pid, started):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_a_sigterm_right_after_a_node_is_forked_still_reaps_it(
    tmp_path: Path, monkeypatch, mode: str
) -> None:
    """SIGTERM lands the moment the node process exists, before ``spawn`` recorded it: ``spawn`` still raises the
    KeyboardInterrupt (the run stops), but only once the node is known, so ``reap_all`` kills it."""
    sleeper = tmp_path / "sleeper"
    sleeper.write_text("#!/bin/sh\nexec sleep 120\n")
    sleeper.chmod(0o755)
    python = sys.executable if mode == "fork" else str(sleeper)
    host = LocalHost(tmp_path / "run", "tcp://127.0.0.1:1", keys=None, mode=mode, python=python)
    started: list[tuple[int, int]] = []
    real_start = LocalHost._start

    def start_then_sigterm(self: LocalHost, cmd: list[str], log_path: Path):
        proc = real_start(self, cmd, log_path)
        started.append((proc.pid, start_time(proc.pid) or 0))
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: before spawn records the node
        return proc

    monkeypatch.setattr(LocalHost, "_start", start_then_sigterm)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        with pytest.raises(KeyboardInterrupt):
            host.spawn(0, 1, "Iowa", False)
        assert signal.getsignal(signal.SIGTERM) is _terminate  # the CLI's handler is back in place
        host.reap_all()
        ((pid, birth),) = started
        assert _gone(pid, birth), f"node process {pid} was left running"
    finally:
        signal.signal(signal.SIGTERM, previous)
        for pid, birth in started:  # the planted bug's orphan: ours, by pid
            if running(pid, birth):
                os.kill(pid, signal.SIGKILL)


def _session(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (pid → command line)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            out[int(d.name)] = cmd[:100]
    return out


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("after_nodes", [1, 3])
def test_swarm_run_stopped_by_sigterm_while_it_starts_its_nodes_leaves_no_process(
    tmp_path: Path, after_nodes: int
) -> None:
    """``swarm run`` (its own session) gets SIGTERM once it logged ``after_nodes`` node starts: it exits 130, and
    within 30 s no process of its session is left (no node, forkserver or resource tracker)."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "checkfree",
        "swarm",
        "run",
        "--setting",
        "ours",
        "--config",
        "swarm_tiny.json",
    ]
    cmd += ["--no-schedule", "--iterations", "3", "--time-scale", "0", "--data", "synthetic"]
    cmd += ["--run-dir", str(run_dir)]
    with open(tmp_path / "console.log", "w") as console:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT, start_new_session=True
        )
    left: dict[int, str] = {}
    try:
        log = run_dir / "supervisor.log"
        deadline = time.monotonic() + 180
        while not log.exists() or log.read_text().count("host: started node") < after_nodes:
            assert proc.poll() is None and time.monotonic() < deadline, "swarm run did not start its nodes"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130
        deadline = time.monotonic() + 30
        while (left := _session(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"left behind: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for pid in _session(proc.pid):  # what the bug leaves: processes this test started, by pid
            os.kill(pid, signal.SIGKILL)
