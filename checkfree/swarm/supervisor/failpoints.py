"""Fault injection for the resume tests: the supervisor SIGKILLs itself at a named point of its loop.

``CHECKFREE_SUPERVISOR_DIE_AT=POINT:ITERATION`` (unset in every real run) makes the supervisor send itself SIGKILL,
as a preempted machine would, the first time its loop reaches ``POINT`` at training iteration ``ITERATION``
(tests/swarm/test_resume.py; docs/swarm.md, "Resuming a run whose supervisor died"):

* ``committed`` — iteration ``ITERATION`` was committed and journaled, no attempt at the next one has begun;
* ``begun`` — an attempt at ``ITERATION`` was broadcast (``begin``): microbatches are in flight;
* ``commit-partial`` — the commit of ``ITERATION`` was journaled and sent to one node only, which has stepped
  (the commit race: the other members hold their averaged gradients and wait for a ``commit`` that never comes);
* ``recovering`` — a replacement joined during the recovery before ``ITERATION`` and does not serve yet.

A resumed supervisor (``swarm run --resume``) reads the variable too: the tests unset it before resuming.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from checkfree import PACKAGE_LOG

log = logging.getLogger(__name__)

ENV = "CHECKFREE_SUPERVISOR_DIE_AT"
POINTS = ("committed", "begun", "commit-partial", "recovering")


def armed(point: str, iteration: int) -> bool:
    """The variable names ``point`` at ``iteration``.

    Raises:
        ValueError: the variable is set but is not ``POINT:ITERATION`` with a point of :data:`POINTS`.
    """
    value = os.environ.get(ENV)
    if not value:
        return False
    name, _, at = value.partition(":")
    if name not in POINTS or not at.isdigit():
        raise ValueError(
            f"{ENV} is {value!r}; expected POINT:ITERATION with POINT one of {', '.join(POINTS)}."
        )
    return name == point and int(at) == iteration


def die_if(point: str, iteration: int, after_s: float = 0.0) -> None:
    """SIGKILL this process when :func:`armed`, ``after_s`` seconds later (the messages sent last leave first), after
    a log line naming the point (logs are flushed by then)."""
    if armed(point, iteration):
        time.sleep(after_s)
        log.warning("supervisor: %s=%s:%d: SIGKILL to itself", ENV, point, iteration)
        for handler in PACKAGE_LOG.handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
