"""The supervisor's journal: its control state on disk, so that a supervisor that dies can be resumed
(``swarm run --resume RUN_DIR``; docs/swarm.md, "Resuming a run whose supervisor died").

``<run_dir>/journal.json`` (mode 0600: it holds the swarm secret, like the join token) is rewritten atomically
(a temporary file in the run directory, written, ``fsync``-ed, renamed over the journal, the directory
``fsync``-ed), so a reader sees the previous journal or the new one, never half of one, even when the machine
loses power. The supervisor writes it

* at every committed iteration, and just *before* it broadcasts ``commit`` (the commit's *intent*: the attempt,
  its iteration, members, every pipeline's ``ITERATION_END`` and every node's ``ready``), so a resumed supervisor
  can finish a commit some nodes stepped and others did not (checkfree.swarm.supervisor.adoption);
* before a node starts (its id reserved: never handed out twice) and once it runs (its pid and the start time of
  its process, checkfree.swarm.process_identity: a resumed supervisor signals only these processes, by pid);
* before a scheduled crash fires (it never fires twice), after an eviction, a rollback and a resume, and when the
  run ends (``status``).

What it holds (``checkfree-swarm-journal-v1``): the options the run was started with (``options``: what
``swarm run --resume`` reads instead of a command line), the supervisor's control state
(:meth:`SupervisorState.to_json <checkfree.swarm.supervisor.state.SupervisorState.to_json>`: roster, iteration,
attempt counter, schedule clock, crashes fired, retry counts, checkpoints stored, the attempt begun), the swarm
secret (``swarm_secret``, Z85; None with ``--insecure``) and the ids whose keys were revoked, the commit intent,
the results so far (every attribute of :class:`~checkfree.swarm.supervisor.results.Results`, so throughput.json
covers the whole run), the node processes (``processes``: node → [pid, start time]), the recovery kills fired,
the supervisor's address, port, pid and start time, and how many times the run was resumed.

:class:`Journal` writes; :func:`read_journal` reads and checks (one sentence per problem, as a
:class:`JournalError`, a ``ValueError``: ``swarm run`` exits 2). :func:`encode_results` / :func:`decode_results`
turn a Results into plain data and back, generically: a field a later version adds travels with the others.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from checkfree import jsonio
from checkfree.recovery.record import RecoveryRecord
from checkfree.swarm.supervisor.results import CrashRecord, Results
from checkfree.swarm.wire.auth import SwarmKeys

JOURNAL_FILE = "journal.json"
JOURNAL_FORMAT = "checkfree-swarm-journal-v1"
REQUIRED = ("options", "state", "results", "processes", "address", "port", "status", "supervisor")
"""Top-level keys every journal holds."""


class JournalError(ValueError):
    """A journal is missing, unreadable, of another format, or does not fit this swarm; the text names the file."""


def write_atomic(path: Path, text: str, mode: int = 0o600) -> int:
    """Replace ``path`` by ``text`` atomically and durably (temporary file → fsync → rename → fsync of the
    directory); the file gets ``mode``. Returns the bytes written.

    Raises:
        OSError: the run directory cannot be written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # an old temporary file keeps its mode otherwise
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return len(data)


class Journal:
    """Writes ``<run_dir>/journal.json`` from ``content()`` (the supervisor's; module docstring).

    Args:
        run_dir: the run directory. content: the journal's data now (plain data, strict JSON but for
            non-finite losses, which :func:`checkfree.jsonio.dumps` writes as null with their reason).
        enabled: False writes nothing (``bench_swarm.py`` measures what the journal costs).

    Attributes:
        writes, seconds, nbytes: journal writes so far, the seconds they took and the bytes they wrote.
    """

    def __init__(self, run_dir: Path, content: Callable[[str], dict[str, Any]], enabled: bool = True) -> None:
        self.path = Path(run_dir) / JOURNAL_FILE
        self.content, self.enabled = content, enabled
        self.writes, self.seconds, self.nbytes = 0, 0.0, 0

    def write(self, why: str) -> None:
        """Write the journal now (``why``: what happened, kept in the file).

        Raises:
            OSError: the run directory cannot be written (the run stops: a supervisor that cannot journal could
                not be resumed).
        """
        if not self.enabled:
            return
        t0 = time.perf_counter()
        data = {"format": JOURNAL_FORMAT, "why": why, "written": time.time(), **self.content(why)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.nbytes += write_atomic(self.path, jsonio.dumps(data))
        self.writes += 1
        self.seconds += time.perf_counter() - t0


def read_journal(run_dir: Path) -> dict[str, Any]:
    """The journal of the run in ``run_dir``, checked for its format and top-level keys.

    Raises:
        JournalError: no journal, unreadable, not JSON, another format or a key missing (one sentence).
    """
    path = Path(run_dir) / JOURNAL_FILE
    if not Path(run_dir).is_dir():
        raise JournalError(
            f"--resume {run_dir}: no such directory; expected the run directory of a swarm run."
        )
    if not path.is_file():
        raise JournalError(
            f"--resume {run_dir}: it holds no {JOURNAL_FILE}; expected the run directory of a swarm run whose "
            "supervisor journals its state (every swarm run does, unless it was started before journals existed)."
        )
    try:
        data = jsonio.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise JournalError(
            f"{path} cannot be read ({type(exc).__name__}); expected the swarm's journal."
        ) from None
    if not isinstance(data, dict) or data.get("format") != JOURNAL_FORMAT:
        raise JournalError(f"{path} is not a {JOURNAL_FORMAT} journal; expected one written by `swarm run`.")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise JournalError(f"{path} lacks {missing}; expected a complete {JOURNAL_FORMAT} journal.")
    return data


def keys_of(data: dict[str, Any]) -> SwarmKeys | None:
    """The swarm's keys from a journal (None: the run is ``--insecure``), with the revoked ids.

    Raises:
        JournalError: the secret is not 40 Z85 characters.
    """
    secret = data.get("swarm_secret")
    if secret is None:
        return None
    try:
        keys = SwarmKeys(zmq.utils.z85.decode(str(secret).encode("ascii")))
    except (ValueError, UnicodeEncodeError):
        raise JournalError(
            "the journal's swarm_secret is not 40 Z85 characters; the journal is damaged."
        ) from None
    keys.revoked = set(data.get("revoked_keys", []))
    return keys


def secret_of(keys: SwarmKeys | None) -> str | None:
    """The swarm secret as the journal holds it (Z85 text; None with ``--insecure``)."""
    return None if keys is None else zmq.utils.z85.encode(keys.secret_bytes()).decode("ascii")


# ---------------------------------------------------------------------------------------------- the results


def encode_results(results: Results) -> dict[str, Any]:
    """Every attribute of ``results`` but its config, as plain data (int-keyed dicts, sets and crash records
    tagged so that :func:`decode_results` restores them); ``t0`` becomes ``elapsed_s`` (seconds of the results'
    clock now, or None before training started) and ``written_wall`` (epoch seconds now).

    Raises:
        TypeError: an attribute holds an object the journal cannot write (a field added to Results must be plain
            data, a CrashRecord or a RecoveryRecord).
    """
    out = {}
    for name, value in vars(results).items():
        # a function set on the object (a test's clock) is no data
        if name in ("cfg", "t0") or callable(value):
            continue
        out[name] = _encode(value, name)
    out["elapsed_s"] = results.now() if results.t0 is not None else None
    out["written_wall"] = time.time()
    return out


def decode_results(results: Results, data: dict[str, Any]) -> None:
    """Restore into ``results`` what :func:`encode_results` wrote; its clock continues where it was, the time since
    the journal was written (the outage) included.

    Raises:
        JournalError: the data is not what :func:`encode_results` writes.
    """
    try:
        for name, value in data.items():
            if name not in ("elapsed_s", "written_wall"):
                _restore(results, name, value)
        elapsed = data["elapsed_s"]
        if elapsed is not None:
            gap = max(0.0, time.time() - float(data["written_wall"]))
            results.t0 = time.monotonic() - float(elapsed) - gap
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(
            f"the journal's results cannot be read back ({exc}); the journal is damaged."
        ) from None


def _encode(value: Any, where: str) -> Any:
    if isinstance(value, CrashRecord):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        fields["recovery"] = value.recovery.to_json() if value.recovery is not None else None
        return {"__crash__": fields}
    if isinstance(value, RecoveryRecord):
        return {"__record__": value.to_json()}
    if isinstance(value, dict):
        if value and all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            return {"__int_keys__": [[k, _encode(v, where)] for k, v in value.items()]}
        if not all(isinstance(k, str) for k in value):
            raise TypeError(
                f"Results.{where} is a dict with keys of mixed types; the journal cannot write it"
            )
        return {k: _encode(v, where) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return {"__set__": [_encode(v, where) for v in sorted(value)]}
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if hasattr(value, "__dict__") and not callable(
        value
    ):  # a record object of Results (its plain attributes)
        return {"__attrs__": {k: _encode(v, f"{where}.{k}") for k, v in vars(value).items()}}
    raise TypeError(f"Results.{where} holds a {type(value).__name__}; the journal writes only plain data")


def _restore(owner: Any, name: str, value: Any) -> None:
    """Set ``owner.name`` from its journaled ``value``; an object's attributes go into the object ``owner`` holds."""
    if isinstance(value, dict) and set(value) == {"__attrs__"}:
        target = getattr(owner, name)
        for key, item in value["__attrs__"].items():
            _restore(target, key, item)
        return
    setattr(owner, name, _decode(value))


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__crash__"}:
        fields = dict(value["__crash__"])
        record = fields.pop("recovery")
        return CrashRecord(
            **fields, recovery=RecoveryRecord.from_json(record) if record is not None else None
        )
    if set(value) == {"__record__"}:
        return RecoveryRecord.from_json(value["__record__"])
    if set(value) == {"__int_keys__"}:
        return {int(k): _decode(v) for k, v in value["__int_keys__"]}
    if set(value) == {"__set__"}:
        return {_decode(v) for v in value["__set__"]}
    return {k: _decode(v) for k, v in value.items()}
