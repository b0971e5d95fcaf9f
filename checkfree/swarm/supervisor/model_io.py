"""The trained model out of the swarm: gathered when the run ends, and snapshots for losing the whole swarm.

**The model comes out.** However a run ends (completed, Ctrl-C / SIGTERM, ``SwarmError``) while every stage still
has a serving replica, the supervisor asks one serving replica per stage for its weights (its own
WEIGHTS_REQUEST, which a node answers without a grant: checkfree.swarm.node.parts), checks every answer against
the stage's shapes and for finite values, and writes them as one checkpoint of the simulator's universal format
(checkfree.checkpoint.store: per-layer safetensors, sha256 per file, written to a temporary directory and renamed
into place) at ``<run_dir>/model/iter_<version>``: stage 0's embedding, final norm and head in
``stage0.safetensors``, transformer stage s's blocks as global layers (s − 1)·L … s·L − 1. ``python -m checkfree
export RUN_DIR`` makes a Hugging Face model of it (checkfree.export). The answers must all hold one version (the
committed iterations); a run stopped between two stages' commits says so instead. A stage without a serving
replica, or one whose replica does not answer within ``request_timeout``, is said in one sentence (the log and
throughput.json's ``model``), never a traceback.

**Snapshots for disaster** (``snapshot_every`` N > 0; off by default). CheckFree needs no checkpoint to recover a
lost stage; a snapshot is for losing every replica of a stage at once with no neighbour to rebuild it from, or the
whole swarm. After every N-th committed iteration the supervisor asks one serving replica per stage for its
weights and Adam state and goes on training: each node answers from its loop between two messages (a copy of its
tensors into the send buffer), the answers arrive while the next attempt runs, and a background thread checks them
and writes ``<run_dir>/snapshots/iter_<version>`` (the universal format with Adam state; the newest two are kept).
A node answers the request before any later ``commit`` (one link, in order), so every stage answers at the version
the request was sent at. A snapshot is taken only when the previous one is written; one whose answers do not all
come within ``request_timeout`` is given up with why. The newest complete snapshot's path (relative to the run
directory) and iteration are in the records (checkfree.swarm.supervisor.model_records ``newest_snapshot``).

:class:`ModelIO` acts at once and never waits on the network: the supervisor's loop receives the answers
(:meth:`ModelIO.on_weights` is the inbox's handler of WEIGHTS_RESPONSE) and waits for the gather in its gathering
phase (checkfree.swarm.supervisor.phases.gathering). An answer to a request of the supervisor's that it gave up is ignored;
an answer to none is refused and counted against its sender.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as WriteTimeout
from pathlib import Path
from typing import Any

import torch

from checkfree.checkpoint import store
from checkfree.checkpoint.store import CheckpointError, Snapshot
from checkfree.swarm.config import SwarmConfig
from checkfree.swarm.node.compute import build_stage
from checkfree.swarm.supervisor.link import Link
from checkfree.swarm.supervisor.model_records import ModelRecords
from checkfree.swarm.supervisor.state import Roster, Slot
from checkfree.swarm.wire import weights as W
from checkfree.swarm.wire.protocol import Message, MessageType, ProtocolError

log = logging.getLogger(__name__)

MODEL_DIR = "model"
"""The run directory's folder of the model gathered at the end (one checkpoint, ``iter_<version>``)."""
SNAPSHOT_DIR = "snapshots"
"""The run directory's folder of the snapshots (the newest :data:`KEEP_SNAPSHOTS`)."""
KEEP_SNAPSHOTS = 2
EXPIRED_REQUESTS = 4096
"""Ids of given-up requests remembered (their late answers are ignored, not counted against the node)."""


def live_members(
    roster: Roster, silent: set[int], exited: Callable[[int], int | None]
) -> dict[int, list[int]]:
    """Stage → its serving occupants that have not fallen silent nor exited (``exited(node)``: its exit code,
    None while it runs or when another machine hosts it)."""
    return {
        stage: [n for n in ids if n not in silent and exited(n) is None]
        for stage, ids in roster.members().items()
    }


class WeightsFetch:
    """One answer per stage, from one serving replica each, to the supervisor's own requests.

    Args:
        link: sends the requests. members: stage → serving nodes (the first of each is asked).
        optimizer: ask for Adam's moments too. purpose: "model" or "snapshot" (named in messages).
    """

    def __init__(self, link: Link, members: dict[int, list[int]], optimizer: bool, purpose: str) -> None:
        self.optimizer, self.purpose = optimizer, purpose
        self.t_requested = time.monotonic()
        self.t_complete: float | None = None
        self.requests: dict[str, tuple[int, int]] = {}
        """Request id → (stage, node asked)."""
        self.answers: dict[int, Message] = {}
        self.failed: str | None = None
        for stage, ids in sorted(members.items()):
            rid = secrets.token_hex(16)
            self.requests[rid] = (stage, ids[0])
            meta = {"stage": stage, "request": rid} | ({"optimizer": True} if optimizer else {})
            link.send(ids[0], MessageType.WEIGHTS_REQUEST, meta)

    def take(self, msg: Message) -> bool:
        """Keep ``msg`` if it answers one of this fetch's requests (False: it does not).

        Raises:
            ProtocolError: it names this fetch's request but comes from another node or holds another stage.
        """
        asked = self.requests.get(msg.meta["request"])
        if asked is None:
            return False
        stage, node = asked
        if msg.sender != node or msg.meta["stage"] != stage or "part" in msg.meta:
            raise ProtocolError(
                f"an answer to the supervisor's {self.purpose} request for stage {stage} of node {node}"
            )
        if "error" in msg.meta:
            self.failed = f"node {node} answered the {self.purpose} request for stage {stage} with {msg.meta['error']!r}"
        elif stage not in self.answers:
            self.answers[stage] = msg
        if self.complete() and self.t_complete is None:
            self.t_complete = time.monotonic()
        return True

    def complete(self) -> bool:
        """Every stage answered."""
        return len(self.answers) == len(self.requests)

    def missing(self) -> list[tuple[int, int]]:
        """(stage, node) of the requests not answered yet."""
        return sorted(sn for sn in self.requests.values() if sn[0] not in self.answers)

    def fetch_s(self) -> float:
        """Seconds from the requests to the last answer (or until now)."""
        return (self.t_complete or time.monotonic()) - self.t_requested

    def nbytes(self) -> int:
        """Tensor bytes of the answers."""
        return sum(t.numel() * t.element_size() for m in self.answers.values() for t in m.tensors.values())


def snapshot_of(
    answers: dict[int, Message], cfg: SwarmConfig, setting: str, vocab_size: int, optimizer: bool
) -> Snapshot:
    """The universal-format checkpoint (checkfree.checkpoint.store) of one answer per stage: ``param/*`` of every
    stage, with ``optimizer`` also ``exp_avg/*``, ``exp_avg_sq/*`` and ``step/*`` (Adam, once it has stepped).

    Raises:
        ProtocolError: an answer's weights or moments are not its stage's (names, shapes, dtypes) or hold NaN/inf,
            or the stages answered at different versions.
    """
    versions = {s: int(m.meta["version"]) for s, m in answers.items()}
    if len(set(versions.values())) != 1:
        raise ProtocolError(
            f"the stages answered at different versions {versions} (the run stopped between two stages' commits)"
        )
    L, files, layer_stage = cfg.model.n_layers_per_stage, {}, {}
    for stage, msg in sorted(answers.items()):
        with torch.device("meta"):  # shapes only: nothing is allocated or initialised
            template = build_stage(cfg.model, stage, vocab_size, cfg.init_seed)
        source = f"node {msg.sender} (stage {stage})"
        weights = W.split(msg.tensors, "w")
        W.check_state(template, weights, source)
        moments = {k: W.split(msg.tensors, k) for k in ("m", "v")} if optimizer else {}
        for k, state in moments.items():
            if state and state.keys() != weights.keys():
                raise ProtocolError(f"the Adam moments {k}.* of {source} do not name the stage's parameters")
            W.check_finite(state, source)
            for name, t in state.items():
                if t.shape != weights[name].shape:
                    raise ProtocolError(f"the Adam moment {k}.{name} of {source} is {tuple(t.shape)}")
        for name, tensor in weights.items():
            fname, local = store.file_of(stage, name, L)
            if fname != "stage0":
                layer_stage[str(int(fname.removeprefix("layer_")))] = stage
            f = files.setdefault(fname, {})
            f[f"param/{local}"] = tensor
            if moments.get("m") and moments.get("v"):
                f[f"exp_avg/{local}"] = moments["m"][name]
                f[f"exp_avg_sq/{local}"] = moments["v"][name]
                f[f"step/{local}"] = torch.tensor(float(msg.meta["step"]))
    version = next(iter(versions.values()))
    stages = sorted(answers)
    meta = {
        "format": store.FORMAT,
        "iteration": version,
        "effective_iteration": version,
        "world_size": cfg.replicas,
        "n_stages": cfg.n_stages,
        "n_layers_per_stage": L,
        "layer_stage": layer_stage,
        "lr_multipliers": [float(answers[s].meta["lr"]) / cfg.model.lr for s in stages],
        "grad_norms": [float(answers[s].meta["grad_norm"]) for s in stages],
        "strategy": setting,
        "config": cfg.model.to_json(),
        "swarm": {"nodes": {str(s): answers[s].sender for s in stages}, "vocab_size": vocab_size},
    }
    return Snapshot(version, version, files, meta)


def write_answers(
    answers: dict[int, Message],
    cfg: SwarmConfig,
    setting: str,
    vocab_size: int,
    optimizer: bool,
    root: Path,
    keep: int,
) -> tuple[Path, int, float]:
    """Check and write one answer per stage as a checkpoint under ``root`` (:func:`snapshot_of`,
    checkfree.checkpoint.store.write_snapshot); returns (its directory, tensor bytes, seconds).

    Raises:
        ProtocolError: an answer does not fit (:func:`snapshot_of`). CheckpointError: the disk refused the write.
    """
    t0 = time.monotonic()
    snap = snapshot_of(answers, cfg, setting, vocab_size, optimizer)
    path = store.write_snapshot(snap, root, keep=keep)
    return path, snap.nbytes, time.monotonic() - t0


class ModelIO:
    """The supervisor's gather of the model at the end and its snapshots during training.

    Args:
        cfg, setting, vocab_size: the run (the stages' shapes, the checkpoint's config).
        link: sends the requests. run_dir: where ``model/`` and ``snapshots/`` go. records: what throughput.json
        records (checkfree.swarm.supervisor.model_records). now: the results' clock (seconds since training
        started). cache_dir: the data cache (the corpus's tokenizer is recorded with the model, for the export).
    """

    def __init__(
        self,
        cfg: SwarmConfig,
        setting: str,
        vocab_size: int,
        link: Link,
        run_dir: Path,
        records: ModelRecords,
        now: Callable[[], float],
        cache_dir: Path | None = None,
    ) -> None:
        self.cfg, self.setting, self.vocab_size, self.link = cfg, setting, vocab_size, link
        self.run_dir, self.records, self.now, self.cache_dir = Path(run_dir), records, now, cache_dir
        self.snapshot: WeightsFetch | None = None
        """The snapshot being fetched (None: none)."""
        self.writing: tuple[WeightsFetch, Future, float] | None = None
        """The snapshot being written by the background thread: its fetch, the write, when it was requested."""
        self.gather_fetch: WeightsFetch | None = None
        self.expired: deque[str] = deque(maxlen=EXPIRED_REQUESTS)
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ answers (the inbox's handler)

    def on_weights(self, slot: Slot, msg: Message) -> list[Any]:
        """A WEIGHTS_RESPONSE from a member: kept by the fetch it answers (a complete snapshot fetch goes to the
        writer at once); nothing for the processes to do.

        Raises:
            ProtocolError: it answers no request of the supervisor (nor one it gave up), or does not fit the
                request it names.
        """
        for fetch in (self.snapshot, self.gather_fetch):
            if fetch is not None and fetch.take(msg):
                if fetch is self.snapshot and fetch.complete():
                    self._write_snapshot()
                return []
        if msg.meta["request"] in self.expired:
            return []  # a late answer to a request given up
        raise ProtocolError("a weights answer to no request of the supervisor")

    def _expire(self, fetch: WeightsFetch) -> None:
        self.expired.extend(fetch.requests)

    # ------------------------------------------------------------------ snapshots

    def after_commit(self, iteration: int, members: dict[int, list[int]]) -> None:
        """Called after every commit (``iteration`` iterations committed): record a snapshot written, give up one
        whose answers are late, and ask for the next when one is due and none is in flight."""
        self.poll()
        every = self.cfg.snapshot_every
        if not every or iteration % every or self.snapshot is not None or self.writing is not None:
            return
        if any(not ids for ids in members.values()):
            self._snapshot_given_up(iteration, "a stage has no serving replica")
            return
        self.snapshot_iteration, self.snapshot_t = iteration, self.now()
        self.snapshot = WeightsFetch(self.link, members, optimizer=True, purpose="snapshot")

    def poll(self) -> None:
        """Record the snapshot the background thread finished; give up a fetch past ``request_timeout``.

        Raises:
            Exception: a bug in the background write (anything but the errors a peer or the disk cause).
        """
        fetch = self.snapshot
        if fetch is not None and fetch.failed is None and fetch.fetch_s() > self.cfg.request_timeout:
            fetch.failed = (
                f"no answer within {self.cfg.request_timeout:.0f} s from (stage, node) {fetch.missing()}"
            )
        if fetch is not None and fetch.failed is not None:
            self._snapshot_given_up(self.snapshot_iteration, fetch.failed)
            self._expire(fetch)
            self.snapshot = None
        if self.writing is None or not self.writing[1].done():
            return
        fetch, future, t_requested = self.writing
        self.writing = None
        try:
            path, nbytes, write_s = future.result()
        except (ProtocolError, CheckpointError) as exc:
            self._snapshot_given_up(int(next(iter(fetch.answers.values())).meta["version"]), str(exc))
            return
        record = {
            "iteration": int(next(iter(fetch.answers.values())).meta["version"]),
            "path": str(path.relative_to(self.run_dir)),
            "bytes": nbytes,
            "fetch_s": fetch.fetch_s(),
            "write_s": write_s,
            "nodes": {str(s): m.sender for s, m in sorted(fetch.answers.items())},
            "t_requested": t_requested,
            "t_written": self.now(),
        }
        self.records.snapshots.append(record)
        log.info(
            "supervisor: snapshot of iteration %d written to %s (%.1f MiB, fetched in %.2f s, written in %.2f s)",
            record["iteration"],
            path,
            nbytes / 2**20,
            record["fetch_s"],
            write_s,
        )

    def _write_snapshot(self) -> None:
        """Hand the complete snapshot fetch to the background writer (training goes on meanwhile)."""
        fetch, self.snapshot = self.snapshot, None
        assert fetch is not None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        root, keep = self.run_dir / SNAPSHOT_DIR, KEEP_SNAPSHOTS
        args = (fetch.answers, self.cfg, self.setting, self.vocab_size, True, root, keep)
        self.writing = (fetch, self._pool.submit(write_answers, *args), self.snapshot_t)

    def _snapshot_given_up(self, iteration: int, why: str) -> None:
        self.records.snapshots_given_up.append({"iteration": iteration, "why": why, "t": self.now()})
        log.warning("supervisor: the snapshot of iteration %d is given up: %s", iteration, why)

    def finish_snapshots(self, timeout: float) -> None:
        """At the end (once :meth:`settled` or past its deadline): a snapshot whose answers did not all come is given
        up; one being written is waited for (``timeout`` s)."""
        if self.snapshot is not None:
            self.snapshot.failed = "the run ended before every stage answered"
            self.poll()
        if self.writing is not None:
            try:
                self.writing[1].exception(timeout=timeout)
            except WriteTimeout:
                self._snapshot_given_up(self.snapshot_iteration, f"still being written after {timeout:.0f} s")
                self.writing = None
            self.poll()
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    # ------------------------------------------------------------------ the model, at the end

    def gather(self, members: dict[int, list[int]]) -> bool:
        """Ask one serving replica per stage for its weights; False (and the sentence recorded) when a stage has
        none."""
        lost = sorted(s for s, ids in members.items() if not ids)
        if lost:
            self._no_model(
                f"stage{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))} "
                f"{'have' if len(lost) > 1 else 'has'} no serving replica"
            )
            return False
        self.gather_fetch = WeightsFetch(self.link, members, optimizer=False, purpose="model")
        return True

    def settled(self) -> bool:
        """The gather (if any) has every stage's answer or failed, and no snapshot waits for answers."""
        gather, snap = self.gather_fetch, self.snapshot
        gathered = gather is None or gather.complete() or gather.failed is not None
        return gathered and (snap is None or snap.failed is not None)

    def write_model(self) -> None:
        """Write the gathered weights to ``<run_dir>/model/`` (or record why there is no model)."""
        fetch, self.gather_fetch = self.gather_fetch, None
        if fetch is None:
            return
        if fetch.failed is not None or not fetch.complete():
            why = (
                fetch.failed
                or f"no answer within {self.cfg.request_timeout:.0f} s from (stage, node) {fetch.missing()}"
            )
            self._expire(fetch)
            self._no_model(why)
            return
        try:
            args = (
                fetch.answers,
                self.cfg,
                self.setting,
                self.vocab_size,
                False,
                self.run_dir / MODEL_DIR,
                1,
            )
            path, nbytes, write_s = write_answers(*args)
        except (ProtocolError, CheckpointError) as exc:
            self._no_model(str(exc))
            return
        version = int(next(iter(fetch.answers.values())).meta["version"])
        self.records.model = {
            "path": str(path.relative_to(self.run_dir)),
            "iteration": version,
            "nodes": {str(s): m.sender for s, m in sorted(fetch.answers.items())},
            "bytes": nbytes,
            "fetch_s": fetch.fetch_s(),
            "write_s": write_s,
            "seconds": fetch.fetch_s() + write_s,
            "tokenizer_dir": self._tokenizer_dir(),
        }
        log.info(
            "supervisor: the model of iteration %d is in %s (%.1f MiB in %.2f s); python -m checkfree export %s "
            "--out DIR makes a Hugging Face model of it",
            version,
            path,
            nbytes / 2**20,
            self.records.model["seconds"],
            self.run_dir,
        )

    def _tokenizer_dir(self) -> str | None:
        """The corpus tokenizer's directory (None for synthetic data, or when the data cache is gone)."""
        if self.cfg.data != "corpus":
            return None
        from checkfree.data.corpus import DataSpec, prepare_corpus

        m = self.cfg.model
        spec = DataSpec.from_config(m, max_train_tokens=m.max_train_tokens, cache_dir=self.cache_dir)
        try:
            return str(
                prepare_corpus(spec).tokenizer_dir
            )  # the cache the run started from: mapped, not rebuilt
        except (OSError, ValueError) as exc:
            log.warning(
                "supervisor: the tokenizer of the corpus is not found (%s); export needs --tokenizer", exc
            )
            return None

    def _no_model(self, why: str) -> None:
        sentence = f"The model is not kept: {why}."
        self.records.model = {"path": None, "why": sentence}
        log.warning("supervisor: %s", sentence)
