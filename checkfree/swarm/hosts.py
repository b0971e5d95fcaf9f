"""Node processes on this machine: start them, SIGKILL them by pid, reap everything.

Two ways to start a node, both a separate OS process running ``checkfree.swarm.node.node.main``:

* ``fork`` (default): from a multiprocessing *forkserver* that has imported torch, transformers and the
  node code once (a warm standby). A node then starts in milliseconds instead of the 3–8 s an import
  costs on a loaded 2-core machine, so the measured crash → serving latency is detection + join + weight
  transfer, not Python start-up (report it as such).
* ``exec``: ``subprocess.Popen([python, -m, checkfree.swarm.node.node, ...])`` (the command printed by dry runs).

One log file per node, ``<run_dir>/node<id>.log`` (stdout and stderr), and, in an authenticated swarm, one key
file per node, ``<run_dir>/keys/node<id>.json`` (mode 0600: the node's own CURVE secret key and the
supervisor's public key, checkfree.swarm.wire.auth), written just before the node starts. Nothing is written to the working
directory. With a device map (``swarm run --device/--gpus``, checkfree.swarm.devices) each stage node gets
``--device cpu|cuda:N`` and the run log says which (``node_devices`` keeps it for throughput.json). Only
processes this object started are ever signalled, by their pid (never by name). An ``atexit`` hook kills
whatever is still running if the supervisor itself dies of an exception.

**A stop signal at any moment leaves nothing behind.** ``swarm run`` turns SIGTERM into a KeyboardInterrupt
(checkfree.cli), which Python raises wherever the main thread is. Raised after the forkserver forked a node but
before :meth:`LocalHost.spawn` recorded its pid, it used to orphan that node, and with it the forkserver and its
resource tracker (every forked node holds the forkserver's liveness pipe, so the server waits for it). So a
node's start, from the fork to the record of its pid, and :meth:`LocalHost.reap_all` run under
:func:`held_signals`: SIGINT and SIGTERM that arrive inside are handled right after, when the node is known and
is reaped like every other.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from checkfree.swarm.devices import DeviceMap
from checkfree.swarm.forkserver import forkserver_context as _forkserver
from checkfree.swarm.forkserver import forkserver_ready, warm_forkserver
from checkfree.swarm.process_identity import AdoptedProcess, running, start_time
from checkfree.swarm.wire.auth import MachineKeys, SwarmKeys

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The stop signals :func:`held_signals` holds."""


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then handle them as they would have been (their handler
    runs, in order; a default SIGTERM ends the process). Python handles signals in the main thread only, so in
    another thread (a supervisor a test runs in a thread) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, object]] = []

    def hold(signum: int, frame: object) -> None:
        pending.append((signum, frame))

    previous = {s: signal.signal(s, hold) for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for signum, frame in pending:
            handler = previous[signum]
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)


def _node_entry(argv: list[str], log_path: str) -> None:
    """Child side of a forked node: stdout/stderr to its log, then the node's main."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    from checkfree.swarm.node.node import main

    sys.exit(main(argv))


class _Forked:
    """The Popen-like face of a forked node: pid, poll(), wait(timeout).

    A forkserver process holds two pipe ends in this process until it is closed; they are released
    (``Process.close``) as soon as its exit is seen, so a long run does not run out of file descriptors.
    """

    def __init__(self, proc: mp.process.BaseProcess) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.code: int | None = None

    def _seen(self) -> int | None:
        if self.code is None and self.proc.exitcode is not None:
            self.code = self.proc.exitcode
            self.proc.close()
        return self.code

    def poll(self) -> int | None:
        return self._seen()

    def wait(self, timeout: float) -> int:
        if self.code is None:
            self.proc.join(timeout)
        code = self._seen()
        if code is None:
            raise subprocess.TimeoutExpired("node", timeout)
        return code


class LocalHost:
    """Starts and kills this machine's node processes.

    Args:
        run_dir: where node logs go. bootstrap: the supervisor's address. bind_host/advertise_host: passed
        to nodes. cache_dir: data cache for stage-0 nodes. python: interpreter (default: this one).
        keys: the swarm's keys (the supervisor's) or this machine's (a launcher's), from which key files are
        written; None: nodes run ``--insecure``.
        devices: this machine's node → device rule; None: no ``--device`` (the node's default, the CPU).
    """

    def __init__(
        self,
        run_dir: Path,
        bootstrap: str,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        cache_dir: Path | None = None,
        python: str = sys.executable,
        mode: str = "fork",
        keys: SwarmKeys | MachineKeys | None = None,
        devices: DeviceMap | None = None,
    ) -> None:
        if mode not in ("fork", "exec"):
            raise ValueError(f"process start mode is {mode!r}; expected 'fork' or 'exec'.")
        self.run_dir, self.bootstrap, self.bind_host = Path(run_dir), bootstrap, bind_host
        self.advertise_host, self.cache_dir, self.python, self.mode = advertise_host, cache_dir, python, mode
        self.keys, self.devices = keys, devices
        self.node_devices: dict[int, str] = {}
        """node id → the device it was started on (stage nodes of a run with a device map)."""
        self.procs: dict[int, subprocess.Popen | _Forked | AdoptedProcess] = {}
        self.started: dict[int, int] = {}
        """node id → its process's start time (checkfree.swarm.process_identity): with the pid, what the
        supervisor journals so that a resumed supervisor signals only these processes."""
        atexit.register(self.reap_all)

    def device_for(self, node: int, stage: int, replacement: bool) -> str | None:
        """The device node ``node`` gets (None: no map, or the storage node, which holds no model)."""
        if self.devices is None or stage < 0:
            return None
        if not replacement:
            return self.devices.initial(node)
        live = [d for n, d in self.node_devices.items() if n in self.procs and self.procs[n].poll() is None]
        return self.devices.replacement(live)

    def command(
        self, node: int, stage: int, location: str, replacement: bool, device: str | None = None
    ) -> list[str]:
        """The command line that starts node ``node`` (on ``device`` when given)."""
        cmd = [
            self.python,
            "-m",
            "checkfree.swarm.node.node",
            "--id",
            str(node),
            "--stage",
            str(stage),
            "--location",
            location,
            "--bootstrap",
            self.bootstrap,
            "--bind-host",
            self.bind_host,
        ]
        if self.advertise_host:
            cmd += ["--advertise-host", self.advertise_host]
        if self.cache_dir is not None:
            cmd += ["--cache-dir", str(self.cache_dir)]
        if replacement:
            cmd.append("--replacement")
        if device is not None:
            cmd += ["--device", device]
        cmd += ["--key-file", str(self.key_file(node))] if self.keys is not None else ["--insecure"]
        return cmd

    def warm_up(self, wait: bool = False) -> None:
        """Start the forkserver in the background (``fork`` mode: :func:`warm_forkserver`); ``wait``: until it is
        ready."""
        if self.mode == "fork":
            warm_forkserver()
            if wait:
                forkserver_ready()
                log.info("host: the forkserver is ready: a node starts in milliseconds")

    def key_file(self, node: int) -> Path:
        return self.run_dir / "keys" / f"node{node}.json"

    def spawn(
        self, node: int, stage: int, location: str, replacement: bool, admitted: dict[int, str] | None = None
    ) -> int:
        """Start node ``node``; returns its pid. ``admitted``: the public keys its key file lists (the supervisor's
        ``SwarmKeys.admitted``; checkfree.swarm.wire.auth)."""
        for proc in self.procs.values():
            proc.poll()  # releases the pipes of nodes that exited unnoticed (one marked dead for silence)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.keys is not None:
            self.keys.write_key_file(self.key_file(node), node, admitted or {})
        device = self.device_for(node, stage, replacement)
        cmd = self.command(node, stage, location, replacement, device)
        log_path = self.run_dir / f"node{node}.log"
        if self.mode == "fork":
            forkserver_ready()  # a start warm_forkserver began (one that failed is retried, and raises, below)
            _forkserver()  # started and warm before the signals are held: only the fork itself waits
        with held_signals():  # from the fork to the record of its pid: a stop signal waits (module docstring)
            proc = self._start(cmd, log_path)
            self.procs[node] = proc
        started = start_time(proc.pid)
        if started is not None:
            self.started[node] = started
        if device is not None:
            self.node_devices[node] = device
        log.info(
            "host: started node %d (stage %d, %s%s), pid %d%s",
            node,
            stage,
            location,
            ", replacement" if replacement else "",
            proc.pid,
            f", device {device}" if device is not None else "",
        )
        return proc.pid

    def _start(self, cmd: list[str], log_path: Path) -> subprocess.Popen | _Forked:
        """Start the process of ``cmd`` (forked from the forkserver, or exec'd), its output to ``log_path``."""
        if self.mode == "fork":
            child = _forkserver().Process(
                target=_node_entry, args=(cmd[3:], str(log_path)), daemon=False, name=log_path.stem
            )
            child.start()
            return _Forked(child)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(log_path, "ab") as logf:  # the child has its own copy; ours closes at once
            return subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.run_dir,
            )

    def identity(self, node: int) -> tuple[int, int] | None:
        """(pid, start time) of node ``node``'s process while it runs, else None."""
        proc, started = self.procs.get(node), self.started.get(node)
        if proc is None or started is None or proc.poll() is not None:
            return None
        return proc.pid, started

    def adopt(self, node: int, pid: int, started: int) -> bool:
        """Take over node ``node``'s process, started by a supervisor that died (pid ``pid``, start time
        ``started``): True if it still runs as that process; from now on it is killed, reaped and polled as if
        this object had started it (checkfree.swarm.process_identity.AdoptedProcess)."""
        if not running(pid, started):
            return False
        self.procs[node], self.started[node] = AdoptedProcess(pid, started), started
        return True

    def exited(self, node: int) -> int | None:
        """Exit code of a node that has exited, None while it runs (or if it is not ours)."""
        proc = self.procs.get(node)
        return None if proc is None else proc.poll()

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` by pid and reap it (a real crash: no goodbye, no flushing)."""
        proc = self.procs.get(node)
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("host: node %d (pid %d) survived SIGKILL for 10 s", node, proc.pid)

    def wait_all(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in total for every node to exit by itself."""
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def reap_all(self) -> None:
        """SIGKILL every node still running (by pid) and wait for each (releasing its pipes). Idempotent; a
        stop signal that arrives meanwhile is handled once every node is reaped (:func:`held_signals`)."""
        with held_signals():
            for node, proc in self.procs.items():
                if proc.poll() is None:
                    log.warning("host: killing node %d (pid %d) at shutdown", node, proc.pid)
                    os.kill(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    log.error("host: node %d (pid %d) could not be reaped", node, proc.pid)
