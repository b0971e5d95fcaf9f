"""The forkserver every forked node starts from (checkfree.swarm.hosts ``fork`` mode), apart from the node code so
that it can be started before this process imports torch.

The server imports torch, transformers and the node code once (``set_forkserver_preload``); a node then starts in
milliseconds. Those imports take seconds: a fresh run pays them at its first node's start; ``swarm run --resume``
begins them in the background (:func:`warm_forkserver`) as soon as its journal is checked, beside the resumed
supervisor's own imports, and the supervisor waits for them (:func:`forkserver_ready`) before training goes on, so
that the first replacement after a resume starts as fast as in a run never interrupted. This module imports neither
torch nor any other part of checkfree.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time

log = logging.getLogger(__name__)

PRELOAD = ["checkfree.swarm.node.node", "checkfree.swarm.storage"]
"""What the server imports once, for every process it forks."""
_FORKSERVER: mp.context.BaseContext | None = None
_WARMING: threading.Thread | None = None
"""The server's start in the background (:func:`warm_forkserver`), which a spawn waits for."""


def forkserver_context() -> mp.context.BaseContext:
    """The forkserver context every forked node starts from (the server itself starts with the first node)."""
    global _FORKSERVER
    if _FORKSERVER is None:
        # Before the server starts, whatever the first node's device: the server keeps this environment for
        # every node it forks, and a CUDA availability check at import (NVML-based with this variable) must not
        # initialise CUDA in the server, which would poison its CUDA children.
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        # The server's imports (seconds) happen here, where a stop signal may interrupt them: a process that
        # does nothing is forked and waited for (interrupted, it ends by itself, and so does the server then).
        warm_up = ctx.Process(target=_nothing, name="forkserver-warm-up")
        warm_up.start()
        warm_up.join()
        warm_up.close()
        _FORKSERVER = ctx
    return _FORKSERVER


def warm_forkserver() -> None:
    """Start the forkserver now, in the background (seconds: it imports torch and the node code), so that a later
    spawn forks in milliseconds (:func:`forkserver_ready` waits for it). A fresh run's first spawn starts the server;
    a resumed supervisor starts no node until its first replacement, which would otherwise wait for those imports:
    ``swarm run --resume`` calls this as soon as the journal is checked (checkfree.swarm.cli)."""
    global _WARMING
    if _FORKSERVER is not None or _WARMING is not None:
        return

    def warm() -> None:
        t0 = time.monotonic()
        forkserver_context()
        log.info("host: forkserver ready in %.1f s", time.monotonic() - t0)

    log.info("host: starting the forkserver ahead of the first spawn")
    _WARMING = threading.Thread(target=warm, name="forkserver-warm-up", daemon=True)
    _WARMING.start()


def forkserver_ready() -> None:
    """Wait until the start :func:`warm_forkserver` began is over (at once if none was begun)."""
    if _WARMING is not None:
        _WARMING.join()


def _nothing() -> None:
    """The forkserver's warm-up process (:func:`forkserver_context`)."""
