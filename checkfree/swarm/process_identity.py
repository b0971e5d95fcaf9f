"""Which process a pid is: its start time, so a resumed supervisor signals only the processes its predecessor
started, never a process that got a reused pid.

A pid alone does not name a process: once one exits, the kernel hands its number to the next process it starts.
A pid together with the process's start time (``/proc/PID/stat`` field 22, clock ticks since boot) does, for as
long as the machine runs. The supervisor journals both for every node it starts
(checkfree.swarm.supervisor.journal); a resumed supervisor takes over the nodes that still run with that start
time (:class:`AdoptedProcess`), which are no longer its children: they were forked from its predecessor's
forkserver and, when that died, became children of the machine's init process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

POLL_S = 0.02
"""Seconds between two looks at ``/proc`` while waiting for an adopted process to exit."""


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (field 3, the state, first); None if there is no
    such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat`` field 22); None if there is no
    such process."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def running(pid: int, started: int) -> bool:
    """Process ``pid`` runs and is the one that started at ``started`` (not a zombie, not a reused pid)."""
    fields = _stat_fields(pid)
    return fields is not None and int(fields[19]) == started and fields[0] not in ("Z", "X")


class AdoptedProcess:
    """The Popen-like face (``pid``, ``poll``, ``wait``) of a node process another supervisor started.

    Args:
        pid, started: the process and its start time (:func:`start_time`), as journaled.

    A process that is not this process's child cannot be waited for: :meth:`poll` looks at ``/proc``. Its exit
    code is the one ``/proc/PID/stat`` shows while it is a zombie (field 52, in :func:`os.waitpid`'s form, decoded
    as :class:`subprocess.Popen` does: −signal or the exit status), or −1 when init has reaped it already.
    """

    def __init__(self, pid: int, started: int) -> None:
        self.pid, self.started = pid, started
        self.code: int | None = None

    def poll(self) -> int | None:
        """None while the process runs; its exit code once it has exited (−1: unknown, reaped by init)."""
        if self.code is not None:
            return self.code
        fields = _stat_fields(self.pid)
        if fields is not None and int(fields[19]) == self.started:
            if fields[0] not in ("Z", "X"):
                return None
            status = int(fields[49]) if len(fields) > 49 else -1
            self.code = -1 if status < 0 else _decode(status)
        else:
            self.code = -1  # gone (and perhaps its pid reused): its exit code went with it
        return self.code

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the process to exit; its exit code.

        Raises:
            subprocess.TimeoutExpired: it still runs after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("adopted node", timeout)
            time.sleep(POLL_S)
        return code

    def kill(self) -> None:
        """SIGKILL the process if it is still the one adopted (checked just before the signal)."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _decode(status: int) -> int:
    """A wait status (:func:`os.waitpid`) as :class:`subprocess.Popen` reports it: −signal, or the exit status."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
